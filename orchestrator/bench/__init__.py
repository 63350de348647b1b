"""Benchmarks of the deployed SGLang server, their report, and a sweep over speculative settings.

- `bench.run_bench`: runs the installed SGLang's own serving benchmark on each host against
  the deployed server, one run per concurrency; writes runs/<id>/bench/results.json.
- `report.write_report`: Markdown + PNG plots from bench results (and a Gantt chart of the
  stages of deploy runs, `gantt.py`).
- `tune.run_tune`: deploys each candidate speculative setting through the playbook's stages,
  benchmarks it, resumes where it stopped, and names the best setting per concurrency.

Nothing here prints: the CLI (`orchestrator.cli.bench_cmds`) renders.
"""
