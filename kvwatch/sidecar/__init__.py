"""`kvwatch run`, the sidecar: tail engine logs, scrape engine /metrics, serve kvwatch's /metrics.

Modules, by concern: ``app`` (the Sidecar: wiring and lifecycle), ``consumer`` (the consumer
thread: the queue, the appends a render asks for, the predictions), ``appends`` (a
render's request that the consumer read the logs' appends, waited for within a bound), ``server`` (the
bounded HTTP server: sockets, timeouts, connection cap), ``wire`` (HTTP/1.1 message format), ``http`` (endpoints, TLS context), ``auth``
(basic auth, failure limiter), ``saving`` (when the state file is written, and its
consistent cut), ``sources`` (per-source
readers and counters), ``messages`` (what goes on the consumer's queue). The config.json of a
logged model is found by ``kvwatch.sources.hub.discover_model_config`` (huggingface_hub's
cache rules; the Hub only with ``fetch_model_configs``).

Threading model -- every thread, what it may touch, and why that is safe:

* **main** -- ``start()``, then sleeps in ``wait()`` until a signal; ``stop()``.
* **tailer** (one per ``--log`` file or glob, ``LogTailer``'s own thread, plus watchdog's observer
  thread that only rings its doorbell) -- reads appended lines and applies each at once:
  ``LogSource.on_line`` -> ``LinePipeline.feed`` -> ``Fleet.apply``, under that tailer's delivery
  lock, then ``SaveSchedule.mark``.
* **HTTP selector** (``kvwatch-http``) -- all socket I/O of kvwatch's port: accepts (at most
  ``server.MAX_CONNECTIONS``, ``server.MAX_PER_CLIENT`` per client address), TLS handshakes, reads
  request heads and writes responses, each under a deadline; it answers /healthz itself (a
  constant: ``Endpoints.immediate``), runs no other handler and touches no state.
* **HTTP workers** (``kvwatch-http-worker-N``, ``server.WORKERS`` of them) -- run the handler for a
  complete request whose client is still there: basic auth (``auth.BasicAuth``, its own lock), and
  for /metrics ``http.SharedRender``: one render at a time, shared by every scrape that arrived
  before it began. A render reads only a snapshot of state; it runs no part of the input path (no
  file read, queue drain, line parse or engine scrape). It starts with ``Sidecar.refresh``: it puts
  a ``ReadAppends`` on the consumer's queue and waits for its event (``appends.AppendRequests``, at
  most ``app.APPENDS_WAIT``; not at all while an earlier request is still unanswered, so a read
  stuck in the kernel delays one scrape by that bound, no more), so a scrape is never behind the
  log; then it renders
  a ``Fleet.snapshot`` (frozen copies) with the predictions the consumer made
  (``Predictor.prepared``: a look-up; an instance with none yet has no prediction rows until the
  next scrape). / does the same. No render reads a model's config.json.
* **scrape** (one per ``--metrics-url``) -- fetches the engine's /metrics and reads it as it
  arrives (its own ``MetricsReader``, used by no other thread), then puts a ``Scraped`` message
  with the events on the queue; it never touches the fleet. ``stop()`` aborts a fetch in flight.
* **stdin** (``--log -``) -- puts ``StdinLine`` / ``StdinClosed`` messages on the queue.
* **consumer** (``kvwatch-consumer``, ``consumer.Consumer``) -- the only reader of the queue:
  applies scrape events and stdin lines, reads the tailers' appends for a render (``ReadAppends``:
  ``LogTailer.refresh``, under the tailer's delivery lock and in file order, then sets the
  render's event), makes the predictions whenever the startup facts moved (``Predictor.prepare``:
  finding, reading -- with ``fetch_model_configs`` fetching -- and sizing a model's config.json,
  before it answers a ``ReadAppends``, so the render that asked finds them), and is the only thread
  that writes the state file (``SaveSchedule.save``). The predictor's cache lock is held only for a
  look-up or a store, so a render never waits for a prediction being made.

So ``Fleet.apply`` is called from several threads (tailers, consumer); the fleet's lock makes
each call atomic, and each source's lines reach it from one place at a time and in order (the
tailer's delivery lock, or the consumer for stdin and /metrics). A save holds every tailer's
delivery lock while it takes the positions and the fleet, so the two describe the same lines; what
the consumer applies cannot change meanwhile because the consumer is the thread saving.
"""
