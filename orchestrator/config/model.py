"""Typed, validated configuration objects: playbooks, stages, retry policies, inventories.

These pydantic models are the schema of the YAML formats (`orchestrator schema` prints them as
JSON Schema). The loader (`orchestrator.config.loader`) turns YAML into these, attaching a
`Location` to each object so every later error can name file:line:column.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

# parse_duration lives in config.durations (stdlib only); importable from here as before
from orchestrator.config.durations import parse_duration as parse_duration
from orchestrator.errors import Location
from orchestrator.selection import members

#: a float of seconds written as 30, 30s, 5m or 1h (a stage param's type)
Duration = Annotated[float, BeforeValidator(parse_duration)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, defer_build=True)
    _location: Location | None = PrivateAttr(default=None)
    # Locations of the values inside this object, keyed by their path relative to it, as written
    # in YAML (aliases, not field names): ("with", "port"), ("needs", 0), ("vars", "workdir").
    _field_locations: dict[tuple[Any, ...], Location] = PrivateAttr(default_factory=dict)

    @property
    def location(self) -> Location | None:
        """Where this object was written (file:line:column), when loaded from YAML."""
        return self._location

    def location_of(self, *path: Any) -> Location | None:
        """Where a value inside this object was written, e.g. `stage.location_of("with", "port")`.

        Falls back to the nearest enclosing value that has a location, then to the object's own.
        """
        key = tuple(path)
        while key:
            if key in self._field_locations:
                return self._field_locations[key]
            key = key[:-1]
        return self._location


def _scalar_text(v: Any) -> Any:
    """Environment values may be written as numbers or booleans; they are passed as text."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return v


class RetrySpec(_Strict):
    """When and how a stage is re-run. `on` lists "connection" and/or exit codes."""

    attempts: int = Field(3, ge=1, le=1000)
    delay: float = Field(2.0, ge=0)
    backoff: float = Field(2.0, ge=1.0)
    max_delay: float = Field(60.0, ge=0)
    on: list[Literal["connection"] | int] = Field(default_factory=lambda: ["connection"])

    @field_validator("delay", "max_delay", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> float:
        return parse_duration(v)


class StageSpec(_Strict):
    """One stage of a playbook: `uses: KIND` + `with:` params, or `run: SHELL`."""

    id: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
    description: str | None = None
    uses: str | None = None
    with_: dict[str, Any] = Field(default_factory=dict, alias="with")
    run: str | None = None
    check: str | None = None
    needs: list[str] = Field(default_factory=list)
    when: str | None = None
    retry: RetrySpec | None = None
    timeout: float | None = None
    hosts: list[str] | None = None
    tags: list[str] = Field(default_factory=list)
    become: bool = False
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("timeout", mode="before")
    @classmethod
    def _timeout(cls, v: Any) -> float | None:
        return None if v is None else parse_duration(v)

    @field_validator("when", mode="before")
    @classmethod
    def _when(cls, v: Any) -> Any:
        return ("true" if v else "false") if isinstance(v, bool) else v

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        return {k: _scalar_text(x) for k, x in v.items()} if isinstance(v, dict) else v

    @field_validator("hosts", "needs", "tags", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _uses_xor_run(self) -> StageSpec:
        if (self.uses is None) == (self.run is None):
            raise ValueError(
                "a stage needs exactly one of `uses:` (a stage kind) or `run:` (shell)"
            )
        if self.run is not None and self.with_:
            raise ValueError("`with:` goes with `uses:`; a `run:` stage takes no `with:`")
        return self

    @property
    def kind(self) -> str:
        """The stage kind: `uses`, or "shell" for a `run:` stage."""
        return self.uses or "shell"


class Playbook(_Strict):
    """A named list of stages plus default variables."""

    name: str
    description: str | None = None
    hosts: list[str] | None = Field(
        None, description="hosts or groups every stage runs on unless it says otherwise"
    )
    vars_files: list[str] = Field(
        default_factory=list,
        description="YAML files of vars (relative to the playbook), merged over `vars:`",
    )
    vars: dict[str, Any] = Field(default_factory=dict)
    secrets: list[str] = Field(
        default_factory=list, description="names of vars whose values are secret"
    )
    stages: list[StageSpec] = Field(min_length=1)
    _source: str | None = PrivateAttr(default=None)
    # values read through `!env NAME` where NAME looks secret (see config.yamlsrc)
    _secret_values: set[str] = PrivateAttr(default_factory=set)

    @field_validator("hosts", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @property
    def source(self) -> str | None:
        """The file this playbook was loaded from."""
        return self._source


class HypervisorSpec(_Strict):
    """The Proxmox host that runs a container host, and the container's id."""

    host: str = Field(description="inventory name of the hypervisor host")
    ctid: int = Field(ge=1)


class HostSpec(_Strict):
    """One host. Without `address` the name is resolved through ~/.ssh/config."""

    name: str = ""
    address: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    user: str | None = None
    identity_file: str | None = None
    connection: Literal["ssh", "local"] = "ssh"
    host_key_policy: Literal["strict", "accept-new"] = "strict"
    known_hosts: str | None = None
    ssh_config: str | None = None
    connect_timeout: float = 10.0
    connect_budget: float = 600.0
    wait_for_host: float | None = Field(
        None, description="how long a deploy waits for SSH at the start (default: --wait-for-host)"
    )
    lock_path: str = Field(
        "~/.orchestrator/deploy.lock", description="the per-host deploy lock file, on the host"
    )
    become_password: str | None = None
    vars: dict[str, Any] = Field(default_factory=dict)
    groups: list[str] = Field(default_factory=list)
    hypervisor: HypervisorSpec | None = None

    @field_validator("connect_timeout", "connect_budget", "wait_for_host", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> float | None:
        return None if v is None else parse_duration(v)

    @field_validator("groups", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v


class GroupSpec(_Strict):
    """A named set of hosts with shared variables."""

    hosts: list[str] = Field(default_factory=list)
    vars: dict[str, Any] = Field(default_factory=dict)

    @field_validator("hosts", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v


class Inventory(_Strict):
    """Hosts, groups and inventory-wide settings."""

    hosts: dict[str, HostSpec] = Field(min_length=1)
    groups: dict[str, GroupSpec] = Field(default_factory=dict)
    vars: dict[str, Any] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)
    defaults: dict[str, Any] = Field(
        default_factory=dict, description="default HostSpec fields for every host"
    )
    _source: str | None = PrivateAttr(default=None)
    # values read through `!env NAME` where NAME looks secret (see config.yamlsrc)
    _secret_values: set[str] = PrivateAttr(default_factory=set)

    @property
    def source(self) -> str | None:
        """The file this inventory was loaded from."""
        return self._source

    def group_members(self, group: str) -> list[str]:
        """Host names in a group: listed under groups.X.hosts or naming X in their `groups`."""
        listed = self.groups[group].hosts if group in self.groups else []
        return members(group, listed, {n: h.groups for n, h in self.hosts.items()})

    def group_names(self) -> set[str]:
        """Every group: those under `groups:` and those its hosts name in their `groups`."""
        return set(self.groups) | {g for h in self.hosts.values() for g in h.groups}
