"""The one mutable place: the fleet of engine instances (``fleet``), their typed fact groups
(``facts``, ``instance``), value checks (``usage_values``) and the state file (``persist``).
Imports nothing itself, so a submodule never imports its siblings through the package."""
