"""Running a rendered plan, split by concern as tox 4's run/ is (single, sequential, parallel):

    state.py     what one run shares (plan, stages, bus, options, Ctrl-C) and its Outcome
    node.py      one stage on one host: check, apply, verify, retries, the check-reconnect rule
    early.py     checks asked ahead of their turn on a host (used by node.py)
    walk.py      one host: its connection, deploy lock, DAG of stages, reboots (boot id)
    parallel.py  schedule: every host at once (`deploy` of a plan without a gateway)
    fleet.py     schedule: every host at once, replicas behind the plan's gateway through a gate
                 (RunState.gate): at most --max-unavailable out of rotation, drained, back in

The schedules are peers: each walks hosts through `HostWalker`'s public methods only, and the
node runner meets a schedule's gate only through `RunState.gate` (state.Gate).
"""
