"""Recipe loading: YAML file (or packaged name) -> `${env:...}` interpolation -> `--set` overrides -> typed Recipe.

Every problem found on the way is collected, not just the first, and reported with its dotted path, the bad
value and what is allowed (`RecipeError`). This is the seed's "validate composition before launching Ray work".
"""

from __future__ import annotations

import copy
import difflib
import os
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Tag, ValidationError

from unirl_core.config.schema import Recipe
from unirl_core.config.schema_base import SectionClass
from unirl_core.errors import UserError
from unirl_core.workspace import workspace

_ENV_PATTERN = re.compile(r"(?<!\$)\$\{env:([A-Za-z_][A-Za-z0-9_]*)(?:,([^}$]*))?\}")  # `$${env:X}` escapes
_LEFTOVER_PATTERN = re.compile(r"(?<!\$)\$\{")
_KEY_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.([A-Za-z_][A-Za-z0-9_]*|[0-9]+))*$")
_MISSING = "<missing>"
_SECTION = "<section>"  # the value was a whole section: its validator's message says what is wrong in it


@dataclass(frozen=True)
class RecipeIssue:
    path: str  # dotted path in the recipe, e.g. train.data.prompts_per_rollout
    value: Any  # the offending value as given
    message: str  # what is wrong and what is allowed

    def __str__(self) -> str:
        if self.value is _SECTION:
            return f"{self.path}: {self.message}" if self.path else self.message
        shown = self.value if self.value is _MISSING else repr(self.value)
        return f"{self.path or '<recipe>'}: got {shown}; {self.message}"


class RecipeError(UserError, ValueError):
    """A recipe that cannot be used; carries every issue found."""

    what = "recipe"  # names the kind of file in the first line; subclasses for other config files set their own

    def __init__(self, source: str, issues: Sequence[RecipeIssue]):
        self.source = source
        self.issues = list(issues)
        lines = [f"{self.what} {source}: {len(self.issues)} error(s)"] + [f"  {issue}" for issue in self.issues]
        super().__init__("\n".join(lines))


def packaged_recipes() -> dict[str, Path]:
    """Recipes shipped inside the package, by name (file stem)."""
    folder = resources.files("unirl_core") / "recipes"
    return {Path(p.name).stem: Path(str(p)) for p in folder.iterdir() if p.name.endswith((".yaml", ".yml"))}


def resolve_recipe_path(ref: str | os.PathLike) -> Path:
    """A recipe file path, or the name of a packaged recipe (`demo`)."""
    path = Path(ref).expanduser()
    if path.is_file():
        return path
    packaged = packaged_recipes()
    if str(ref) in packaged:
        return packaged[str(ref)]
    hint = difflib.get_close_matches(Path(str(ref)).stem, packaged, n=1)  # `dmeo`, `demo.yml`
    suggestion = f"did you mean '{hint[0]}'? " if hint else ""
    raise RecipeError(
        str(ref),
        [
            RecipeIssue(
                "",
                str(ref),
                f"no such file and no packaged recipe of that name; {suggestion}packaged: {sorted(packaged)}",
            )
        ],
    )


def load_recipe(
    ref: str | os.PathLike,
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    unset: Callable[[str], str] | None = None,
) -> Recipe:
    """Load, interpolate, override and validate a recipe. Raises RecipeError listing every problem. `unset(NAME)`
    gives the value of a `${env:NAME}` that is neither set nor defaulted (default: that is a problem)."""
    path = resolve_recipe_path(ref)
    try:
        tree = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise RecipeError(str(path), [RecipeIssue("", _MISSING, f"not valid YAML: {exc}")]) from None
    tree = {} if tree is None else tree
    if not isinstance(tree, dict):
        raise RecipeError(str(path), [RecipeIssue("", tree, "a recipe is a YAML mapping of sections")])
    tree.setdefault("name", path.stem)
    return recipe_from_tree(tree, overrides, env=env, source=str(path), unset=unset)


def recipe_from_tree(
    tree: Mapping[str, Any],
    overrides: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    source: str = "<recipe>",
    unset: Callable[[str], str] | None = None,
) -> Recipe:
    issues: list[RecipeIssue] = []
    tree = copy.deepcopy(dict(tree))
    for override in overrides:  # first, so an override replaces a value whose variable is unset
        apply_override(tree, override, issues)
    tree = interpolate_env(tree, os.environ if env is None else env, issues, unset=unset)
    _merge_precache_file(tree, issues)
    if issues:
        raise RecipeError(source, issues)
    try:
        recipe = Recipe.model_validate(tree)
    except ValidationError as exc:
        raise RecipeError(source, validation_issues(exc, Recipe, tree)) from None
    issues = [RecipeIssue(path, value, message) for path, value, message in recipe.problems()]
    if issues:
        raise RecipeError(source, issues)
    _fill_workspace_defaults(recipe)
    return recipe


def _fill_workspace_defaults(recipe: Recipe) -> None:
    """Empty output locations become folders of the workspace, named after the recipe, spelled out."""
    name = recipe.name or "recipe"
    if recipe.train is not None and recipe.train.output_dir is None:
        recipe.train.output_dir = str(workspace().outputs / name)
    if recipe.ingest is not None and recipe.ingest.dataset_output_root is None:
        recipe.ingest.dataset_output_root = str(workspace().data / name)
    if recipe.precache is not None:
        if recipe.precache.input_dir is None and recipe.ingest is not None:
            recipe.precache.input_dir = f"{recipe.ingest.dataset_output_root.rstrip('/')}/shards"
        if recipe.precache.output_dir is None and recipe.precache.input_dir is not None:
            recipe.precache.output_dir = f"{recipe.precache.input_dir.rstrip('/').rsplit('/', 1)[0]}/precache"
        if recipe.precache.has_video and recipe.train is not None:
            _fill_video_transform(recipe.precache, recipe.train)


def _fill_video_transform(precache, train) -> None:
    """Empty `precache.video_transform` fields: the frames, rate and size the recipe's rollouts sample."""
    sampling, transform = train.sampling, precache.video_transform
    fps = sampling.fps
    if fps is None and transform.fps is None:
        from unirl_core.models.registry import family_class

        fps = getattr(family_class(train.model.family), "fps", None)  # the family's native rate (Wan: 16)
    wanted = {"num_frames": sampling.num_frames, "fps": fps, "width": sampling.width, "height": sampling.height}
    for field, value in wanted.items():
        if getattr(transform, field) is None:
            setattr(transform, field, value)


def _merge_precache_file(tree: dict, issues: list[RecipeIssue]) -> None:
    """`precache.precache_config_path`: a standalone NeMo precache YAML fills the section (its own keys win)."""
    section = tree.get("precache")
    path = section.get("precache_config_path") if isinstance(section, dict) else None
    if not path:
        return
    try:
        loaded = yaml.load(Path(path).expanduser().read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except (OSError, yaml.YAMLError) as exc:
        issues.append(RecipeIssue("precache.precache_config_path", path, f"cannot read it: {exc}"))
        return
    if not isinstance(loaded, dict):
        issues.append(RecipeIssue("precache.precache_config_path", path, "a NeMo precache YAML is a mapping"))
        return
    tree["precache"] = {**loaded, **section}


def dump_resolved(recipe: Recipe) -> str:
    """The fully resolved recipe as YAML (every default spelled out)."""
    return yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


def interpolate_env(node: Any, env: Mapping[str, str], issues: list[RecipeIssue], path: str = "", unset=None) -> Any:
    """Replace `${env:NAME}` and `${env:NAME,default}` in every string of the tree (`unset`: see load_recipe)."""
    if isinstance(node, dict):
        return {k: interpolate_env(v, env, issues, _join(path, str(k)), unset) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate_env(v, env, issues, _join(path, str(i)), unset) for i, v in enumerate(node)]
    if not isinstance(node, str):
        return node

    def substitute(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        if unset is not None:
            return unset(name)
        issues.append(
            RecipeIssue(
                path,
                node,
                f"environment variable {name} is not set; export it or give a default: ${{env:{name},<default>}}",
            )
        )
        return match.group(0)

    before = len(issues)
    value = _ENV_PATTERN.sub(substitute, node)
    if len(issues) == before and _LEFTOVER_PATTERN.search(value):
        issues.append(
            RecipeIssue(
                path,
                node,
                "unresolved `${...}`: write ${env:NAME} or ${env:NAME,default} (defaults cannot nest); "
                "`$${` gives a literal `${`",
            )
        )
    return value.replace("$${", "${")


def apply_override(tree: dict, override: str, issues: list[RecipeIssue]) -> None:
    """Apply one `dotted.key=value` override. Values stay strings (the typed models convert them, as they do
    environment values) except `null`/`~` (None) and YAML lists/maps written `[...]`/`{...}`."""
    key, sep, raw = override.partition("=")
    key = key.strip()
    if not sep or not _KEY_PATTERN.match(key):
        issues.append(RecipeIssue("", override, "an override is dotted.key=value, e.g. train.data.data_path=/x.json"))
        return
    value = _parse_override_value(raw)
    *parents, leaf = key.split(".")
    node: Any = tree
    for i, part in enumerate(parents):
        child = _get_child(node, part)
        if child is None:
            child = {}
            _set_child(node, part, child)
        if not isinstance(child, dict | list):
            where = ".".join(parents[: i + 1])
            issues.append(RecipeIssue(where, child, f"cannot set {key}: {where} is a value, not a section"))
            return
        node = child
    if isinstance(node, list) and not (leaf.isdigit() and int(leaf) < len(node)):
        issues.append(RecipeIssue(key, value, f"index out of range: the list has {len(node)} item(s)"))
        return
    _set_child(node, leaf, value)


def _parse_override_value(raw: str) -> Any:
    text = raw.strip()
    if text in ("null", "~"):
        return None
    if text.startswith(("[", "{")):
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            return raw
    return raw


def _get_child(node: dict | list, part: str) -> Any:
    if isinstance(node, list):
        return node[int(part)] if part.isdigit() and int(part) < len(node) else None
    return node.get(part)


def _set_child(node: dict | list, part: str, value: Any) -> None:
    if isinstance(node, list):
        node[int(part)] = value
    else:
        node[part] = value


def _join(path: str, part: str) -> str:
    return f"{path}.{part}" if path else part


def validation_issues(error: ValidationError, root: type[BaseModel] = Recipe, data: Any = None) -> list[RecipeIssue]:
    """One issue per problem pydantic found validating `root` (any config model) from `data`: the dotted key, the
    value given and the fix, "did you mean" for an unknown key; no pydantic URL or error type."""
    return [_issue_from_pydantic(err, root, data) for err in error.errors(include_url=False)]


def _issue_from_pydantic(err: dict, root: type[BaseModel], data: Any = None) -> RecipeIssue:
    raw = [str(p) for p in err["loc"]]
    loc, _ = _walk(raw, root, data)  # without the union tags pydantic puts in the path
    path = ".".join(loc)
    value = err.get("input", _MISSING)
    if err["type"] == "missing":
        return RecipeIssue(path, _MISSING, "this field is required")
    if err["type"] == "value_error":  # a validator's own message, without pydantic's "Value error, " prefix
        message = str(err.get("ctx", {}).get("error", err["msg"]))
        return RecipeIssue(path, _SECTION if isinstance(value, Mapping) else value, message)
    if err["type"] == "extra_forbidden":
        return RecipeIssue(path, value, unknown_key_message(raw[-1], _allowed_keys(raw[:-1], root, data)))
    return RecipeIssue(path, value, err["msg"])


def unknown_key_message(key: str, allowed: Sequence[str]) -> str:
    """What to say about an unknown `key`: the closest allowed key, if one is close, and every allowed key."""
    hint = difflib.get_close_matches(key, allowed, n=1)
    suggestion = f"did you mean '{hint[0]}'? " if hint else ""
    allowed_text = f"allowed here: {', '.join(allowed)}" if allowed else "this section has no settings yet"
    return f"unknown key; {suggestion}{allowed_text}"


def _allowed_keys(loc: Sequence[str], root: type[BaseModel], data: Any = None) -> list[str]:
    """The keys of the section at `loc` under `root`, through nested models, mappings and lists of them."""
    _, annotation = _walk(loc, root, data)
    model = _model_class(annotation)
    return list(model.model_fields) if model else []


def _walk(loc: Sequence[str], root: type[BaseModel], data: Any = None) -> tuple[list[str], Any]:
    """`loc` without the tags of tagged unions (`train.algorithm` is one config class per algorithm name), and the
    annotation it reaches (None past an unknown key). `data`: the validated tree, where a member's type depends on
    it (an algorithm named by `module:Class` brings its own config class)."""
    annotation: Any = root
    shown: list[str] = []
    for part in loc:
        members = _tagged_members(annotation)
        if part in members:  # pydantic's path names the union member: step into it, show nothing
            annotation = _plugin_config_class(data) if part == "plugin" else members[part]
            continue
        shown.append(part)
        data = data.get(part) if isinstance(data, Mapping) else None
        container = _container_item(annotation)
        if container is not None:  # `part` is a key or an index of a mapping/list: step to its items' type
            annotation = container
            continue
        model = _model_class(annotation)
        field = model.model_fields.get(part) if model else None
        annotation = field.annotation if field is not None else None
        for marker in field.metadata if field is not None else ():
            if isinstance(marker, SectionClass):  # a section whose class its `name` picks (`train.domain`)
                annotation = marker.pick(data)
    return shown, annotation


def _plugin_config_class(section: Any) -> Any:
    """The config class of the algorithm a `train.algorithm` section names by `module:Class` (None if it cannot
    be imported: that error is reported on its own)."""
    from unirl_core.algorithms.registry import algorithm_class

    try:
        return algorithm_class(section["name"]).config_class
    except (KeyError, TypeError, ValueError):
        return None


def _tagged_members(annotation: Any) -> dict[str, Any]:
    """{tag: member type} of a union of `Annotated[X, Tag(...)]` members (a callable-discriminated union)."""
    members = {}
    for arg in typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ():
        tags = [m.tag for m in getattr(arg, "__metadata__", ()) if isinstance(m, Tag)]
        if tags:
            members[tags[0]] = typing.get_args(arg)[0]
    return members


def _container_item(annotation: Any) -> Any:
    """The item type of a `dict[str, X]` or `list[X]` annotation (optional or not), else None."""
    for candidate in (annotation, *typing.get_args(annotation)):
        origin = typing.get_origin(candidate)
        if origin is dict:
            return typing.get_args(candidate)[1]
        if origin is list:
            return typing.get_args(candidate)[0]
    return None


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key written twice in one mapping (YAML itself keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}: it is written twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _model_class(annotation: Any) -> type[BaseModel] | None:
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_class(arg)
            if found:
                return found
    return None
