# workerd config for tests/workerd/test_stream_patterns.py: a JS Worker + one Durable Object class on the real
# workerd binary (node_modules/.bin/workerd), offline. The test passes the listening socket as a file descriptor
# (`--socket-fd http=<fd>`) and the upstream's origin in FLAREBOX_UPSTREAM (a Python HTTP server on 127.0.0.1).
using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [
    (name = "main", worker = .patternsWorker),
    # global fetch(): loopback and private addresses are refused by default (SSRF protection); the upstream is
    # on 127.0.0.1, so this network allows "local" too.
    (name = "net", network = (allow = ["public", "private", "local"])),
  ],
  sockets = [(name = "http", http = (), service = "main")],
);

const patternsWorker :Workerd.Worker = (
  modules = [(name = "main.js", esModule = embed "worker/main.js")],
  compatibilityDate = "2026-11-17",
  bindings = [
    (name = "PATTERNS", durableObjectNamespace = "Patterns"),
    (name = "UPSTREAM", fromEnvironment = "FLAREBOX_UPSTREAM"),
  ],
  durableObjectNamespaces = [(className = "Patterns", uniqueKey = "flarebox-stream-patterns")],
  durableObjectStorage = (inMemory = void),
  globalOutbound = "net",
);
