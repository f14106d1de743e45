"""Every limit of protocol v1. Values come from the seed contract; docs/openapi.yaml repeats each one."""

MAX_COMMAND_BYTES = 64 * 1024  # UTF-8 bytes of `command`
MAX_BODY_BYTES = 1024 * 1024  # any JSON request body
MAX_JSON_DEPTH = 32  # nesting of objects and arrays in a JSON body, checked before it is parsed
MAX_OUTPUT_CHARS = 2_000_000  # Unicode code points of merged stdout+stderr per command
MAX_TIMEOUT_SECONDS = 900
DEFAULT_TIMEOUT_SECONDS = 120
KILL_GRACE_SECONDS = 2  # SIGTERM to the process group, SIGKILL this much later
TIMEOUT_EXIT_CODE = 124
CANCELLED_EXIT_CODE = 130
MAX_PATH_BYTES = 4096  # file paths and cwd, UTF-8 bytes
MAX_ENV_VARS = 256
MAX_ENV_NAME_BYTES = 256
# one "NAME=value" string of `env`, UTF-8 bytes: the kernel refuses a longer one at exec (E2BIG; Linux
# MAX_ARG_STRLEN is 131072 bytes including the terminating NUL)
MAX_ENV_ENTRY_BYTES = 131071
HEARTBEAT_SECONDS = 10  # a heartbeat after this long without another event
DRAIN_IDLE_SECONDS = 0.3  # after the command's own process exits: end after this much silence...
DRAIN_MAX_SECONDS = 5  # ...or after this long at most
MAX_FILE_READ_BYTES = 1024 * 1024 * 1024  # default; operators may lower it
MAX_FILE_WRITE_BYTES = 100 * 1024 * 1024  # default; operators may lower it
MAX_IMPORT_BYTES = 20 * 1024 * 1024 * 1024  # an imported archive: its body, and the bytes its files hold
MAX_IMPORT_ENTRIES = 1_000_000  # files, directories and symlinks one imported archive holds
MAX_OUTPUT_FRAME_CHARS = 16 * 1024  # one `output` event carries at most this many code points
JOURNAL_MAX_REQUESTS = 256  # per-request output journals kept for reattach...
JOURNAL_KEEP_SECONDS = 3600  # ...and for how long after the command ended
LEDGER_MAX_REQUESTS = 4096  # request ids a workspace remembers (replay guard, early cancel)
DEFAULT_IDLE_SECONDS = 600
MIN_TOKEN_CHARS = 32
# the most the server reads of a supervisor's control answer (health, errors, sync, cancel): everything in a
# sandbox is hostile, and one endless answer must not fill the server's memory
CONTROL_BODY_BYTES = 1024 * 1024
MAX_KEY_LABEL_CHARS = 100  # a scoped key's label
MAX_KEY_EXPIRES_IN_SECONDS = 10 * 365 * 86400  # the longest expires_in of a scoped key (10 years)
MAX_KEYS = 10_000  # scoped keys a deployment holds at once
DEFAULT_LIST_ENTRIES = 1000  # entries one page of a directory listing holds unless `limit` says fewer...
MAX_LIST_ENTRIES = 10_000  # ...and at most
MAX_LIST_DEPTH = 32  # levels below the listed directory a listing descends
MAX_PID = 4_194_304  # Linux's highest pid_max
DEFAULT_PTY_COLS = 80  # a terminal session's size unless the query says otherwise...
DEFAULT_PTY_ROWS = 24
MAX_PTY_SIZE = 1000  # ...and at most this many columns or rows
PTY_SCROLLBACK_BYTES = 256 * 1024  # a session's newest output, replayed when it is resumed
PTY_LINGER_SECONDS = 300  # a session without a client ends (SIGHUP to its shell) after this long
MAX_PTY_SESSIONS = 16  # terminal sessions one workspace holds at once
MAX_PAGE_RECORDS = 1000  # audit records (and listed workspaces) one GET answers at most
MAX_SERVICES = 16  # services one workspace defines
SUPERVISOR_PORT = 8080  # the supervisor's own port inside a container: no service may take it
MAX_ALLOW_PATHS = 32  # entries of one service's allow_paths
MAX_ALLOW_PATH_BYTES = 256  # one allow_paths entry
MAX_SECRETS = 64  # secrets one workspace holds
MAX_SECRET_VALUE_BYTES = 32 * 1024  # one secret's value, UTF-8
MAX_SERVICE_SECRETS = 32  # secrets one service (or exec) names
MAX_PROXY_BODY_BYTES = 100 * 1024 * 1024  # a proxied request body (Cloudflare's Free/Pro request limit)
PROXY_HEAD_SECONDS = 60  # a proxied request without the upstream's response head this long after it was sent: 504
SERVICE_READY_SECONDS = 30  # a woken workspace waits at most this long for a service's health path
SERVICE_LOG_CHARS = 1_000_000  # code points of a service's log kept (the newest)
SERVICE_BACKOFF_FIRST_SECONDS = 0.5  # the first restart of a service waits this long, doubling...
SERVICE_BACKOFF_MAX_SECONDS = 30  # ...up to this
SERVICE_QUICK_EXIT_SECONDS = 10  # a run shorter than this counts as a quick exit...
SERVICE_MAX_QUICK_EXITS = 5  # ...and this many in a row end the service `failed`
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
REQUEST_ID_PATTERN = r"^[0-9a-f]{32}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
SERVICE_NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,31}$"
SECRET_NAME_PATTERN = r"^[A-Z_][A-Z0-9_]{0,63}$"
INSTANCE_TYPES = ("lite", "standard-1", "standard-2", "standard-3", "standard-4")
DEFAULT_IMAGE = "hermes"
DEFAULT_CWD = "/workspace"

LIMITS = {
    "MAX_COMMAND_BYTES": MAX_COMMAND_BYTES,
    "MAX_BODY_BYTES": MAX_BODY_BYTES,
    "MAX_JSON_DEPTH": MAX_JSON_DEPTH,
    "MAX_OUTPUT_CHARS": MAX_OUTPUT_CHARS,
    "MAX_TIMEOUT_SECONDS": MAX_TIMEOUT_SECONDS,
    "DEFAULT_TIMEOUT_SECONDS": DEFAULT_TIMEOUT_SECONDS,
    "KILL_GRACE_SECONDS": KILL_GRACE_SECONDS,
    "TIMEOUT_EXIT_CODE": TIMEOUT_EXIT_CODE,
    "CANCELLED_EXIT_CODE": CANCELLED_EXIT_CODE,
    "MAX_PATH_BYTES": MAX_PATH_BYTES,
    "MAX_ENV_VARS": MAX_ENV_VARS,
    "MAX_ENV_NAME_BYTES": MAX_ENV_NAME_BYTES,
    "MAX_ENV_ENTRY_BYTES": MAX_ENV_ENTRY_BYTES,
    "HEARTBEAT_SECONDS": HEARTBEAT_SECONDS,
    "DRAIN_IDLE_SECONDS": DRAIN_IDLE_SECONDS,
    "DRAIN_MAX_SECONDS": DRAIN_MAX_SECONDS,
    "MAX_FILE_READ_BYTES": MAX_FILE_READ_BYTES,
    "MAX_FILE_WRITE_BYTES": MAX_FILE_WRITE_BYTES,
    "MAX_IMPORT_BYTES": MAX_IMPORT_BYTES,
    "MAX_IMPORT_ENTRIES": MAX_IMPORT_ENTRIES,
    "MAX_OUTPUT_FRAME_CHARS": MAX_OUTPUT_FRAME_CHARS,
    "JOURNAL_MAX_REQUESTS": JOURNAL_MAX_REQUESTS,
    "JOURNAL_KEEP_SECONDS": JOURNAL_KEEP_SECONDS,
    "LEDGER_MAX_REQUESTS": LEDGER_MAX_REQUESTS,
    "DEFAULT_IDLE_SECONDS": DEFAULT_IDLE_SECONDS,
    "MIN_TOKEN_CHARS": MIN_TOKEN_CHARS,
    "CONTROL_BODY_BYTES": CONTROL_BODY_BYTES,
    "MAX_KEY_LABEL_CHARS": MAX_KEY_LABEL_CHARS,
    "MAX_KEY_EXPIRES_IN_SECONDS": MAX_KEY_EXPIRES_IN_SECONDS,
    "MAX_KEYS": MAX_KEYS,
    "DEFAULT_LIST_ENTRIES": DEFAULT_LIST_ENTRIES,
    "MAX_LIST_ENTRIES": MAX_LIST_ENTRIES,
    "MAX_LIST_DEPTH": MAX_LIST_DEPTH,
    "MAX_PID": MAX_PID,
    "DEFAULT_PTY_COLS": DEFAULT_PTY_COLS,
    "DEFAULT_PTY_ROWS": DEFAULT_PTY_ROWS,
    "MAX_PTY_SIZE": MAX_PTY_SIZE,
    "PTY_SCROLLBACK_BYTES": PTY_SCROLLBACK_BYTES,
    "PTY_LINGER_SECONDS": PTY_LINGER_SECONDS,
    "MAX_PTY_SESSIONS": MAX_PTY_SESSIONS,
    "MAX_PAGE_RECORDS": MAX_PAGE_RECORDS,
    "MAX_SERVICES": MAX_SERVICES,
    "SUPERVISOR_PORT": SUPERVISOR_PORT,
    "MAX_ALLOW_PATHS": MAX_ALLOW_PATHS,
    "MAX_ALLOW_PATH_BYTES": MAX_ALLOW_PATH_BYTES,
    "MAX_SECRETS": MAX_SECRETS,
    "MAX_SECRET_VALUE_BYTES": MAX_SECRET_VALUE_BYTES,
    "MAX_SERVICE_SECRETS": MAX_SERVICE_SECRETS,
    "MAX_PROXY_BODY_BYTES": MAX_PROXY_BODY_BYTES,
    "PROXY_HEAD_SECONDS": PROXY_HEAD_SECONDS,
    "SERVICE_READY_SECONDS": SERVICE_READY_SECONDS,
    "SERVICE_LOG_CHARS": SERVICE_LOG_CHARS,
    "SERVICE_BACKOFF_FIRST_SECONDS": SERVICE_BACKOFF_FIRST_SECONDS,
    "SERVICE_BACKOFF_MAX_SECONDS": SERVICE_BACKOFF_MAX_SECONDS,
    "SERVICE_QUICK_EXIT_SECONDS": SERVICE_QUICK_EXIT_SECONDS,
    "SERVICE_MAX_QUICK_EXITS": SERVICE_MAX_QUICK_EXITS,
}
