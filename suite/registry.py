"""Finding policies by name: built-in modules, installed entry points, or a user's file.

``--policy`` accepts
- ``NAME`` or ``NAME:key=value,key=value``: a policy registered in a module of ``kvbench.policies``
  (the project's policies/ folder; a module's file name works too when it holds one policy) or by an
  installed package under the entry-point group ``kvbench.policies``;
- ``path/to/file.py:ClassName`` or ``path/to/file.py:ClassName:key=value,...``: a class in a file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import pkgutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic

from kvbench.core.contract import Policy, is_policy_class, policy_name_problem
from kvbench.errors import SpecError
from kvbench.plugins import Registry


@dataclass(frozen=True)
class PolicyRef:
    """Where a policy class came from, for the run record."""

    cls: type[Policy]
    source: str


def builtin_policies() -> dict[str, PolicyRef]:
    """Policies defined in the modules of ``kvbench.policies``, keyed by registered name and module name."""
    import kvbench.policies as package

    found: dict[str, PolicyRef] = {}
    aliases: dict[str, PolicyRef] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"{package.__name__}.{info.name}")
        except Exception as exc:  # a scorer dropped into policies/ that does not import
            raise SpecError(
                f"policies/{info.name}.py raised {type(exc).__name__} on import: {exc}; fix or remove it "
                "(every module in policies/ is imported to find the registered policies)"
            ) from exc
        classes = [c for c in vars(module).values() if is_policy_class(c) and c.__module__ == module.__name__]
        for cls in classes:
            if cls.name in found:
                raise SpecError(
                    f"policy name {cls.name!r} is registered twice: in {found[cls.name].source} and in "
                    f"{module.__name__}; rename one of them"
                )
            found[cls.name] = PolicyRef(cls, f"module {module.__name__}")
        if len(classes) == 1:
            aliases[info.name] = found[classes[0].name]
    return {**{k: v for k, v in aliases.items() if k not in found}, **found}


def _entry_point_policy(cls: Any, target: str) -> PolicyRef:
    if not is_policy_class(cls):
        raise SpecError(f"entry point {target} (kvbench.policies) is not a class decorated with @policy")
    return PolicyRef(cls, f"entry point {target}")


POLICIES: Registry[PolicyRef] = Registry(
    "policy",
    "kvbench.policies",
    lambda: {ref.cls.name: ref for ref in builtin_policies().values()},  # module names are aliases
    _entry_point_policy,
)


def known_policies() -> dict[str, type[Policy]]:
    """Every registered policy by its registered name (no aliases): built-ins, then entry points."""
    return {name: POLICIES.get(name).cls for name in POLICIES.names()}


def load_file_policy(path_text: str, class_name: str) -> PolicyRef:
    """The policy class ``class_name`` of a scorer file, imported here: a user's own code. A submitted
    scorer is never imported in kvbench's process: kvbench.isolation runs it in a process of its own."""
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise SpecError(f"--policy {path_text}:{class_name}: no file {path}")
    module_name = "kvbench_user_policy_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise SpecError(f"--policy {path_text}:{class_name}: {path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's module, whatever it raises: say where, and what
        del sys.modules[module_name]
        raise SpecError(
            f"--policy {path_text}:{class_name}: importing {path} raised {type(exc).__name__}: {exc}; "
            f"fix the file (try `python {path}`) and run again"
        ) from exc
    cls = getattr(module, class_name, None)
    if not is_policy_class(cls):
        names = [n for n, v in vars(module).items() if is_policy_class(v)]
        raise SpecError(
            f"{path} has no policy class {class_name!r} "
            f"(policy classes there: {', '.join(names) or 'none'}); "
            "decorate a kvbench.Policy subclass with @kvbench.policy('name')"
        )
    refuse_builtin_name(cls.name, f"{path}:{class_name}")
    cls.source_sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    cls.source_file = path.name  # what a reader knows it by, not the module name imported under
    return PolicyRef(cls, f"file {path}")


def refuse_builtin_name(name: str, where: str) -> None:
    """A file scorer may not take a built-in's name: its results would pass for the built-in's. Nor a
    name outside @policy's rule: ``@policy`` checks it, but a file can set ``name`` after decorating, and
    an isolated scorer's process says its name itself, so the name is checked again here."""
    problem = policy_name_problem(name)
    if problem:
        raise SpecError(f"{where}: {problem}; give the scorer such a name in @kvbench.policy('...')")
    builtins = builtin_policies()
    if name in builtins:
        raise SpecError(
            f"{where} registers the name {name!r}, which is the built-in policy of "
            f"{builtins[name].source}; give the scorer a name of its own in @kvbench.policy('...')"
        )


def parse_policy_arg(text: str) -> tuple[str, str | None, dict[str, str]]:
    """Split ``--policy`` text into (name or path, class name or None, raw parameters)."""
    head, _, rest = text.partition(":")
    class_name = None
    if head.endswith(".py"):
        class_name, _, rest = rest.partition(":")
        if not class_name:
            raise SpecError(f"--policy {text!r}: a file needs a class, as in path/to/file.py:MyScorer")
    params: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SpecError(f"--policy {text!r}: parameter {item!r} is not key=value (e.g. rkv:lam=0.1)")
        if key.strip() in params:
            raise SpecError(f"--policy {text!r}: parameter {key.strip()!r} is given twice; give it once")
        params[key.strip()] = value.strip()
    return head, class_name, params


def find_policy(name: str, class_name: str | None = None) -> PolicyRef:
    """The class behind a policy name (or a file and class)."""
    if class_name is not None:
        return load_file_policy(name, class_name)
    module = builtin_policies().get(name)  # a registered name, or a module's that holds one policy
    return module or POLICIES.get(name)


def make_policy(text: str, **params: Any) -> Policy:
    """A policy instance from ``--policy`` text, with ``params`` overriding those in the text."""
    name, class_name, raw = parse_policy_arg(text)
    ref = find_policy(name, class_name)
    merged: dict[str, Any] = {**raw, **params}
    try:
        return ref.cls(**merged)
    except pydantic.ValidationError as exc:
        fields = ", ".join(getattr(ref.cls, "__dataclass_fields__", {})) or "none"
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(args)'}: {err['msg']}" for err in exc.errors()
        )
        raise SpecError(
            f"policy {ref.cls.name!r}: bad parameters ({problems}). Its parameters: {fields}"
        ) from None


def policy_record(policy: Policy) -> dict[str, Any]:
    """Name and fully resolved parameters: the policy's part of a result's identity."""
    record = {"name": policy.name, "params": json.loads(json.dumps(policy.params(), default=str))}
    if policy.source_sha256 is not None:  # a file's scorer: an edited file is another policy
        record["source_sha256"] = policy.source_sha256
    return record


def policy_documentation(policy: Policy) -> dict[str, Any]:
    """What the leaderboard shows about a policy, saved with each run: the documentation of the code that
    produced the numbers, not of whatever version is installed where the leaderboard runs."""
    shipped = getattr(policy, "shipped_documentation", None)
    if shipped is not None:  # an isolated scorer: what its own process said, and its file's hash
        return dict(shipped)
    cls = type(policy)
    module = inspect.getmodule(cls)
    source = Path(inspect.getfile(cls))
    return {
        "name": policy.name,
        "summary": inspect.getdoc(cls) or "",
        "module_doc": (module.__doc__ or "") if module is not None else "",
        "module": f"{cls.source_file} (scorer file)" if cls.source_file else cls.__module__,
        "class": cls.__qualname__,
        # a submission ships a non-built-in scorer's file; `kvbench accept` checks it against this hash
        "source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
        "needs": sorted(cls.needs),
    }
