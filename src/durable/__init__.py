"""The workspace object (the Durable Object's logic), runtime-neutral: `workspace.Workspace`.

ports.py        what a runtime provides: storage, alarm, clock, streams, container
settings.py     deployment settings (Worker vars / environment)
workspace.py    the ops' handlers, lifecycle, exec relay, alarms  operations.py the ops and their typed arguments
boot.py         one boot shared by concurrent requests            launches.py   execs not yet handed to the supervisor
state.py        the persisted record and its state machine        store.py      tables in the workspace's SQL storage
ledger.py       request ids seen (replay guard, early cancels)    schedule.py   idle/checkpoint/retry on one alarm
retention.py    which snapshots stay (a pure function)            relay.py      exec streams and work in flight
supervisor_client.py  a client of the container's supervisor       timefmt.py    ISO-8601 timestamps
"""
