"""Product-side knowledge of SGLang: its flags per release, preflight rules, the launch command.

    flags      FlagSet of a release (parsed from `launch_server --help`, or the FACTS.md table)
    preflight  rules that refuse a launch before anything starts (all problems together)
    launch     server arguments, environment, API-key wrapper, fingerprint, systemd unit

Nothing here talks to a host; the sglang_server stage gathers the facts and calls these.
"""
