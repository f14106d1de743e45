"""The workspace object (the Durable Object's logic), runtime-neutral: `workspace.Workspace`.

ports.py        what a runtime provides: storage, alarm, clock, streams, container
settings.py     deployment settings (Worker vars / environment)
workspace.py    the ops, lifecycle, shared boot, exec relay and alarm handling
state.py        the persisted record and its state machine        store.py      tables in the workspace's SQL storage
ledger.py       request ids seen (replay guard, early cancels)    schedule.py   idle/checkpoint/retry on one alarm
retention.py    which snapshots stay (a pure function)            relay.py      NDJSON events and heartbeats
supervisor.py   calls into the container's supervisor             timefmt.py    ISO-8601 timestamps
"""
