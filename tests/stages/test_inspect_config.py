"""inspect_config on a local host with the simulated hub's drafter configs (good and faulty) and
the Kimi K2.6 target config, as seeded on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest
from structlog.testing import capture_logs

from orchestrator.errors import StageError
from orchestrator.stages.base import Converged, Needed
from orchestrator.stages.inspect_config import InspectConfigStage
from orchestrator_sim.hubrepos import EAGLE3_REPO, FAULTY_DRAFTERS, KIMI_REPO, seed_repos
from tests.runner.helpers import cli, local_inventory, write_yaml

EXPECT = {  # what the playbook asks of an EAGLE-3 drafter for a Kimi K2.x target
    "architectures": {"contains": "LlamaForCausalLMEagle3"},
    "num_hidden_layers": {"equals": 1},
    "hidden_size": {"equals_reference": ["hidden_size", "text_config.hidden_size"]},
    "vocab_size": {"equals_reference": ["vocab_size", "text_config.vocab_size"]},
}
HINT = "this drafter was trained for another model; use lightseekorg/kimi-k2.6-eagle3"


@pytest.fixture(scope="module")
def configs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """repo id -> path of its config.json at the main commit (as the hub serves it)."""
    data = tmp_path_factory.mktemp("hubdata")
    heads = seed_repos(data)
    return {repo: data / repo / "commits" / sha / "config.json" for repo, sha in heads.items()}


def make(path: Path | str, reference: Path | str | None = None, expect=None,
         **kw: object) -> InspectConfigStage:
    params = {"path": str(path), "label": "drafter", "reference_label": "target",
              "expect": EXPECT if expect is None else expect, "hint": HINT, **kw}
    if reference is not None:
        params["reference"] = str(reference)
    return InspectConfigStage(InspectConfigStage.Params.model_validate(params))


def test_good_drafter_matches_the_target(configs, local_host, stage_ctx):
    ctx = stage_ctx("inspect")
    stage = make(configs[EAGLE3_REPO], configs[KIMI_REPO])
    with capture_logs() as logs:
        verdict = stage.check(local_host, ctx)
    assert isinstance(verdict, Converged) and "all 4 rules hold" in verdict.reason
    assert "num_hidden_layers=1; hidden_size=7168; vocab_size=163840" in verdict.reason
    assert ctx.facts["config"]["architectures"] == ["LlamaForCausalLMEagle3"]
    (event,) = [e for e in logs if e["event"] == "inspect_config.file"]
    assert event["path"] == str(configs[EAGLE3_REPO]) and '\n  "hidden_size": 7168,' in \
        event["config"]  # pretty-printed
    stage.verify(local_host, ctx)  # read-only: verify is the same inspection


@pytest.mark.parametrize("repo,line", [
    ("sim/eagle3-hidden4096",
     "drafter hidden_size 4096 != target text_config.hidden_size 7168 ({d} vs {t})"),
    ("sim/eagle3-2layers", "drafter num_hidden_layers 2 != 1"),
    ("sim/eagle3-wrong-arch",
     'drafter architectures ["LlamaForCausalLM"] does not contain LlamaForCausalLMEagle3'),
    ("sim/eagle3-vocab-mismatch",
     "drafter vocab_size 129280 != target text_config.vocab_size 163840 ({d} vs {t})"),
])
def test_each_faulty_drafter_fails_in_check_with_both_values(configs, local_host, stage_ctx,
                                                              repo, line):
    assert repo in FAULTY_DRAFTERS
    drafter, target = configs[repo], configs[KIMI_REPO]
    ctx = stage_ctx("inspect")
    with pytest.raises(StageError) as err:
        make(drafter, target).check(local_host, ctx)
    message = err.value.message
    assert message.startswith(f"1 problem(s) in the drafter file {drafter}:")
    assert "    - " + line.format(d=drafter, t=target) in message.splitlines()
    assert err.value.hint == HINT
    assert ctx.facts["problems"] == [line.format(d=drafter, t=target)]


def test_all_mismatches_are_listed_together(configs, tmp_path, local_host, stage_ctx):
    cfg = json.loads(configs[EAGLE3_REPO].read_text())
    cfg.update(hidden_size=4096, num_hidden_layers=2, architectures=["LlamaForCausalLM"])
    del cfg["vocab_size"]
    drafter = tmp_path / "config.json"
    drafter.write_text(json.dumps(cfg))
    with pytest.raises(StageError) as err:
        make(drafter, configs[KIMI_REPO]).check(local_host, stage_ctx())
    lines = err.value.message.splitlines()
    assert lines[0].startswith("4 problem(s)")
    assert [ln.split()[2] for ln in lines[1:]] == ["architectures", "num_hidden_layers",
                                                  "hidden_size", "vocab_size"]
    assert lines[-1] == "    - drafter vocab_size is missing"


def test_reference_lookup_falls_back_and_reports_absent_keys(configs, tmp_path, local_host,
                                                             stage_ctx):
    # K2.6 holds hidden_size only under text_config (the fallback key is used); without
    # vocab_size anywhere there is nothing to compare
    target = json.loads(configs[KIMI_REPO].read_text())
    assert "hidden_size" not in target and "vocab_size" not in target
    del target["text_config"]["vocab_size"]
    ref = tmp_path / "target.json"
    ref.write_text(json.dumps(target))
    with pytest.raises(StageError) as err:
        make(configs[EAGLE3_REPO], ref).check(local_host, stage_ctx())
    assert err.value.message.splitlines()[1:] == [
        f"    - target has none of vocab_size, text_config.vocab_size ({ref}) to compare "
        "drafter vocab_size with"]


def test_other_rules(tmp_path, local_host, stage_ctx):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"a": {"b": [3, "x"]}, "flag": True, "n": 1, "name": "llama-eagle3",
                               "none": None}))
    good = {"a.b.0": {"min": 1, "max": 3, "one_of": [1, 3]}, "a.b.1": {"equals": "x"},
            "flag": {"equals": True}, "n": {"equals": 1}, "name": {"contains": "eagle3"},
            "none": {"equals": None, "exists": True}, "gone": {"exists": False}}
    assert isinstance(make(cfg, expect=good).check(local_host, stage_ctx()), Converged)
    bad = {"a.b.0": {"min": 4}, "a.b.1": {"max": 2}, "flag": {"equals": 1},
           "n": {"equals": True}, "name": {"one_of": ["a", "b"]}, "none": {"exists": False},
           "a.b.5": {"exists": True}}
    with pytest.raises(StageError) as err:
        make(cfg, expect=bad).check(local_host, stage_ctx())
    assert err.value.message.splitlines()[1:] == [
        "    - drafter a.b.0 3 is below the minimum 4",
        "    - drafter a.b.1 x is not a number (max 2)",
        "    - drafter flag true != 1",
        "    - drafter n 1 != true",
        '    - drafter name llama-eagle3 is not one of ["a", "b"]',
        "    - drafter none should not exist (it is null)",
        "    - drafter a.b.5 is missing",
    ]


def test_missing_and_broken_files_name_the_path_and_the_producer(tmp_path, local_host,
                                                                 stage_ctx, configs):
    from orchestrator.config.model import StageSpec

    gone = tmp_path / "models" / "drafter" / "config.json"
    ctx = stage_ctx("inspect")
    ctx.spec = StageSpec.model_validate({"id": "inspect", "uses": "inspect_config",
                                         "needs": ["target", "drafter"]})
    with pytest.raises(StageError) as err:
        make(gone, configs[KIMI_REPO]).check(local_host, ctx)
    assert err.value.message == f"the drafter file {gone} does not exist"
    assert "(target, drafter)" in err.value.hint
    ctx.dry_run = True  # a dry run on a fresh host: the download has not happened yet
    assert make(gone, configs[KIMI_REPO]).check(local_host, ctx) == Needed(
        f"the drafter file {gone} does not exist yet")
    ctx.dry_run = False
    with pytest.raises(StageError, match=f"the target file {tmp_path}/t.json does not exist"):
        make(configs[EAGLE3_REPO], tmp_path / "t.json").check(local_host, ctx)
    half = tmp_path / "half.json"
    half.write_text('{"hidden_size": 71')
    with pytest.raises(StageError, match="is not valid JSON: .* line 1 column"):
        make(half, configs[KIMI_REPO]).check(local_host, ctx)


def test_params_are_validated():
    with pytest.raises(pydantic.ValidationError, match="at least one of"):
        make("/x", expect={"a": {}})
    with pytest.raises(pydantic.ValidationError, match="extra"):
        make("/x", expect={"a": {"equal": 1}})
    with pytest.raises(pydantic.ValidationError, match="needs `reference`"):
        make("/x", expect={"hidden_size": {"equals_reference": "hidden_size"}})


def test_cli_stops_before_launch_with_the_mismatch(configs, tmp_path):
    drafter, target = configs["sim/eagle3-hidden4096"], configs[KIMI_REPO]
    marker = tmp_path / "launched"
    pb = write_yaml(tmp_path / "pb.yaml", {
        "name": "inspect", "stages": [
            {"id": "inspect", "uses": "inspect_config",
             "with": {"path": str(drafter), "reference": str(target), "label": "drafter",
                      "reference_label": "target", "expect": EXPECT, "hint": HINT}},
            {"id": "server", "run": f"touch {marker}", "needs": ["inspect"]},
        ],
    })
    r = cli("deploy", str(pb), "-i", str(local_inventory(tmp_path / "inv.yaml")),
            runs=tmp_path / "runs")
    assert r.code == 1
    assert r.statuses("localhost")["inspect"] == "failed" and not marker.exists()
    out = r.stdout + r.stderr
    assert (f"drafter hidden_size 4096 != target text_config.hidden_size 7168 ({drafter} vs "
            f"{target})") in out
    assert HINT in out
