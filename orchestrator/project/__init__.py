"""The project files `orchestrator init DIR` copies out: the playbooks and configs of this
repository, shipped in the wheel as package data (in a checkout, links to ../../playbooks and
../../configs)."""
