"""The `inspect_config` stage kind: assert facts about a JSON file on the host before launching.

    - id: inspect
      uses: inspect_config
      needs: [target, drafter]
      with:
        path: "{{ drafter_dir }}/config.json"
        label: drafter
        reference: "{{ target_dir }}/config.json"
        reference_label: target
        expect:
          architectures: {contains: LlamaForCausalLMEagle3}
          num_hidden_layers: {equals: 1}             # SGLang 0.5.9 accepts only 1 (use `when:`)
          hidden_size: {equals_reference: [hidden_size, text_config.hidden_size]}
          vocab_size: {equals_reference: [vocab_size, text_config.vocab_size]}
          eagle_config.use_aux_hidden_state: {equals: true}
        hint: "this drafter was trained for another model; use lightseekorg/kimi-k2.6-eagle3"

Keys are dotted paths into the JSON (`text_config.hidden_size`; a number picks a list item,
`architectures.0`). Rules (several may be combined in one mapping, all must hold):
`equals: V`, `contains: V` (a list holding V, or a string holding the text V), `one_of: [..]`,
`min: N`, `max: N`, `exists: true|false`, and `equals_reference: KEY | [KEY, FALLBACK...]` (the
first of those keys present in the `reference` file).

Read-only: the file is read through the host, shown pretty-printed in the log and recorded
(`config`). check() itself decides: converged when every rule holds; otherwise it raises a
StageError listing ALL mismatches with both values and both paths, so the run stops before
anything is launched. There is nothing to apply.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.errors import StageError
from orchestrator.facts.files import PathInfo
from orchestrator.host import Host
from orchestrator.stages.base import CheckResult, Converged, Needed, Params, Stage, StageContext

_MISSING = object()


class Rule(BaseModel):
    """What one key must satisfy; every rule given must hold."""

    model_config = ConfigDict(extra="forbid")

    equals: Any = None
    contains: Any = None
    equals_reference: str | list[str] | None = Field(
        None, description="key, or keys tried in order, in the reference file"
    )
    min: float | None = None
    max: float | None = None
    one_of: list[Any] | None = None
    exists: bool | None = None

    @model_validator(mode="after")
    def _some_rule(self) -> Rule:
        if not self.model_fields_set:
            raise ValueError("a rule needs at least one of: equals, contains, equals_reference, "
                             "min, max, one_of, exists")
        if isinstance(self.equals_reference, list) and not self.equals_reference:
            raise ValueError("equals_reference needs at least one key")
        return self


class InspectConfigParams(Params):
    """Parameters of the inspect_config kind."""

    path: str = Field(description="JSON file on the host to inspect")
    label: str = Field("config", description="name of that file in messages, e.g. drafter")
    reference: str | None = Field(None, description="JSON file for equals_reference rules")
    reference_label: str = Field("reference", description="name of the reference in messages")
    expect: dict[str, Rule] = Field(min_length=1, description="dotted key -> rule")
    hint: str | None = Field(None, description="what to do when a rule fails")

    @model_validator(mode="after")
    def _reference_needed(self) -> InspectConfigParams:
        uses = [k for k, r in self.expect.items() if "equals_reference" in r.model_fields_set]
        if uses and not self.reference:
            raise ValueError(f"equals_reference (for {', '.join(uses)}) needs `reference`")
        return self


def lookup(data: Any, dotted: str) -> Any:
    """The value at a dotted path (`a.b.0`), or the _MISSING marker."""
    value = data
    for part in dotted.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit() and \
                -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class InspectConfigStage(Stage, kind="inspect_config"):
    """Fail early, listing every mismatch, when a JSON config does not have the expected values."""

    speculative_check = True

    Params = InspectConfigParams
    params: InspectConfigParams

    def _load(self, host: Host, ctx: StageContext, path: str, label: str) -> Any:
        try:
            text = host.read_text(path)
        except OSError as exc:
            raise StageError(f"cannot read the {label} file {path}: {exc}") from None
        if text is None:
            needs = ", ".join(ctx.spec.needs)
            raise StageError(
                f"the {label} file {path} does not exist",
                hint=(f"it should have been produced by the stage(s) this one needs ({needs}): "
                      "check they ran and succeeded, and that the path points into their "
                      "output") if needs else "check the path, or add the stage that produces "
                "it to `needs:`",
            )
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise StageError(
                f"the {label} file {path} is not valid JSON: {exc.msg} at line {exc.lineno} "
                f"column {exc.colno}",
                hint="a partial download? delete it and run the download stage again",
            ) from None

    def _problems(self, config: Any, reference: Any) -> tuple[list[str], list[str]]:
        p = self.params
        problems: list[str] = []
        held: list[str] = []
        paths = f"({p.path} vs {p.reference})"
        for key, rule in p.expect.items():
            value = lookup(config, key)
            given = rule.model_fields_set
            name = f"{p.label} {key}"
            shown = "is missing" if value is _MISSING else _show(value)
            before = len(problems)
            if "exists" in given:
                if rule.exists and value is _MISSING:
                    problems.append(f"{name} is missing")
                elif not rule.exists and value is not _MISSING:
                    problems.append(f"{name} should not exist (it is {shown})")
            needs_value = given - {"exists"}
            if needs_value and value is _MISSING:
                if "exists" not in given or rule.exists:
                    problems.append(f"{name} is missing")
                needs_value = set()
            if "equals" in needs_value and not _same(value, rule.equals):
                problems.append(f"{name} {shown} != {_show(rule.equals)}")
            if "contains" in needs_value:
                if isinstance(value, list):
                    ok = any(_same(v, rule.contains) for v in value)
                else:
                    ok = isinstance(value, str) and isinstance(rule.contains, str) and \
                        rule.contains in value
                if not ok:
                    problems.append(f"{name} {shown} does not contain {_show(rule.contains)}")
            if "one_of" in needs_value and not any(_same(value, v) for v in rule.one_of or []):
                problems.append(f"{name} {shown} is not one of {_show(rule.one_of)}")
            for bound in ("min", "max"):
                if bound not in needs_value:
                    continue
                limit = getattr(rule, bound)
                if not _number(value):
                    problems.append(f"{name} {shown} is not a number ({bound} {limit:g})")
                elif (bound == "min" and value < limit) or (bound == "max" and value > limit):
                    word = "below the minimum" if bound == "min" else "above the maximum"
                    problems.append(f"{name} {shown} is {word} {limit:g}")
            if "equals_reference" in needs_value:
                keys = rule.equals_reference
                keys = [keys] if isinstance(keys, str) else list(keys or [])
                ref_key, ref = next(((k, lookup(reference, k)) for k in keys
                                     if lookup(reference, k) is not _MISSING), (None, _MISSING))
                if ref is _MISSING:
                    problems.append(f"{p.reference_label} has none of {', '.join(keys)} "
                                    f"({p.reference}) to compare {name} with")
                elif not _same(value, ref):
                    problems.append(f"{name} {shown} != {p.reference_label} {ref_key} "
                                    f"{_show(ref)} {paths}")
            if len(problems) == before:
                held.append(f"{key}={'(absent)' if value is _MISSING else _show(value)}")
        return problems, held

    def check(self, host: Host, ctx: StageContext) -> CheckResult:
        p = self.params
        if ctx.dry_run and not host.fact(PathInfo, path=p.path).exists:
            # --dry-run on a fresh host: the download that makes it has not run yet
            return Needed(f"the {p.label} file {p.path} does not exist yet")
        config = self._load(host, ctx, p.path, p.label)
        reference = self._load(host, ctx, p.reference, p.reference_label) \
            if p.reference else None
        pretty = json.dumps(config, indent=2, sort_keys=True)
        ctx.log.info("inspect_config.file", label=p.label, path=p.path, config=pretty)
        ctx.record("config", config)
        problems, held = self._problems(config, reference)
        ctx.record("checked", held)
        if problems:
            ctx.record("problems", problems)
            raise StageError(
                f"{len(problems)} problem(s) in the {p.label} file {p.path}:\n"
                + "\n".join("    - " + x for x in problems),
                hint=p.hint or f"fix {p.path} or point `path` at the right files",
            )
        return Converged(f"{p.label}: all {len(held)} rules hold ({'; '.join(held)})")

    def apply(self, host: Host, ctx: StageContext) -> None:
        # Only reached when the file did not exist during a dry-run check: inspect it now.
        self.check(host, ctx)

    def verify(self, host: Host, ctx: StageContext) -> None:
        self.check(host, ctx)

