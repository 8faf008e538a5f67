"""Analysis: predictions, budget attribution, levers and workload plans over the engines' arithmetic.

Pure functions of snapshots, model geometry and deployments; the sidecar's collector and every
offline command (``predict``, ``explain``, ``plan``) call the same ones. Imports nothing itself.
"""
