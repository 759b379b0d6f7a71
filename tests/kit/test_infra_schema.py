"""Every resource and data block of infra/ against the Google providers' published schema.

The schema is infra/schema/google-providers.json, derived by infra/schema/derive_schema.py from the
prebuilt CDK for Terraform provider packages (provider 6.50.0, the newest 6.x they were published for;
versions.tf allows 6.25 and up). Each argument and nested block a block sets must exist there, and
every required one must be set. Meta-arguments (count, for_each, provider, depends_on, lifecycle) are
Terraform's own; a `dynamic "x"` block counts as the nested block x.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import hcl2
import pytest

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
SCHEMA = json.loads((INFRA / "schema/google-providers.json").read_text())
META = {"count", "for_each", "provider", "depends_on", "lifecycle", "providers"}
FILES = sorted([*INFRA.glob("*.tf"), *INFRA.glob("modules/*/*.tf")])


def _unquote(s):
    return s[1:-1] if isinstance(s, str) and len(s) >= 2 and s[0] == s[-1] == '"' else s


def _bodies(value) -> list[dict]:
    """A nested block's instances: hcl2 gives a list of dicts (or one dict)."""
    if isinstance(value, dict):
        return [value]
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def problems(body: dict, schema: dict, where: str) -> list[str]:
    found = []
    keys = {_unquote(k) for k in body if not k.startswith("__")}
    dynamic = {}
    for d in _bodies(body.get("dynamic", [])):
        for name, inner in d.items():
            dynamic[_unquote(name)] = [c for b in _bodies(inner) for c in _bodies(b.get("content", []))]
    for key in sorted(keys - META - {"dynamic"}):
        if key not in schema:
            found.append(f"{where}: no argument or block `{key}` in the provider's schema")
            continue
        block = schema[key]["block"]
        if block is not None:
            raw = body.get(key, body.get(f'"{key}"'))
            for i, inner in enumerate(_bodies(raw)):
                found += problems(inner, block, f"{where}.{key}[{i}]")
    for key, contents in dynamic.items():
        if key not in schema or schema[key]["block"] is None:
            found.append(f"{where}: no nested block `{key}` for its dynamic block")
            continue
        for i, inner in enumerate(contents):
            found += problems(inner, schema[key]["block"], f"{where}.dynamic.{key}[{i}]")
    for key, spec in schema.items():
        if spec["required"] and key not in keys and key not in dynamic:
            found.append(f"{where}: required `{key}` is not set")
    return found


def blocks():
    """(file, kind, type, name, provider, body) of every resource and data block in infra/."""
    out = []
    for path in FILES:
        with open(path) as f:
            doc = hcl2.load(f)
        for kind in ("resource", "data"):
            for group in doc.get(kind, []):
                for rtype, by_name in group.items():
                    for name, body in by_name.items():
                        provider = body.get("provider", "google")
                        provider = provider[0] if isinstance(provider, list) else provider
                        provider = str(provider).strip('"${}')
                        out.append(
                            (path.relative_to(INFRA), kind, _unquote(rtype), _unquote(name), provider, body)
                        )
    return out


BLOCKS = blocks()


def test_infra_has_blocks_to_check():
    types = {b[2] for b in BLOCKS}
    assert {
        "google_tpu_v2_vm",
        "google_compute_instance",
        "google_service_account",
        "google_compute_firewall",
    } <= types


def test_the_schema_covers_every_type_infra_uses():
    for path, kind, rtype, _name, provider, _ in BLOCKS:
        table = SCHEMA[provider]["resources" if kind == "resource" else "data"]
        assert rtype in table, (
            f"{path}: {rtype} is not in the derived schema: run infra/schema/derive_schema.py"
        )


def test_the_schema_is_the_top_of_the_allowed_provider_range():
    versions = (INFRA / "versions.tf").read_text()
    for provider in ("google", "google-beta"):
        assert SCHEMA[provider]["version"] == "6.50.0"
        assert re.search(rf'hashicorp/{provider}"\s+version\s+=\s+">= 6\.25, < 7\.0"', versions)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b[0]}:{b[2]}.{b[3]}" for b in BLOCKS])
def test_every_argument_exists_and_every_required_one_is_set(block):
    path, kind, rtype, name, provider, body = block
    table = SCHEMA[provider]["resources" if kind == "resource" else "data"]
    found = problems(body, table[rtype], f"{path}: {rtype}.{name}")
    assert not found, "\n".join(found)


def test_the_checker_finds_a_misspelt_argument_and_a_missing_required_one():
    schema = SCHEMA["google-beta"]["resources"]["google_tpu_v2_vm"]
    body = {"name": "x", "runtime_version": "v", "network_config": [{"enable_external_ip": False}]}
    assert problems(body, schema, "t") == [
        "t.network_config[0]: no argument or block `enable_external_ip` in the provider's schema"
    ]
    assert problems({"name": "x"}, schema, "t") == ["t: required `runtime_version` is not set"]


def test_the_tpu_arguments_the_kit_needs_are_in_the_beta_provider_only():
    beta = SCHEMA["google-beta"]["resources"]["google_tpu_v2_vm"]
    assert beta["scheduling_config"]["block"]["spot"] and beta["service_account"]["block"]["scope"]
    assert "google_tpu_v2_vm" not in SCHEMA["google"]["resources"]


def test_the_derived_file_is_what_the_script_derives_now(tmp_path):
    cache = Path.home() / ".cache" / "labkit-cdktf"
    if not list(cache.glob("cdktf_cdktf_provider_google*.whl")):
        pytest.skip(
            f"the provider packages are not in {cache} (infra/schema/derive_schema.py downloads them)"
        )
    import runpy

    module = runpy.run_path(str(INFRA / "schema/derive_schema.py"))
    assert module["main"](["--cache", str(cache), "--out", str(tmp_path / "schema.json")]) == 0
    assert json.loads((tmp_path / "schema.json").read_text()) == SCHEMA
