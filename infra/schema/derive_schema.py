"""Derive the Google providers' argument schema for the resources infra/ uses, from the prebuilt CDK for
Terraform provider packages on the package index.

The provider binaries (and `terraform providers schema -json`) need registry.terraform.io, which the
kit's development machines cannot reach. The same schema is published, as jsii type information, in
`cdktf-cdktf-provider-google` and `cdktf-cdktf-provider-google-beta` (about 50 MB each, too large to
keep in the repository). This script downloads them once into a cache outside the repository, reads
every resource and data source that infra/*.tf and infra/modules/*/*.tf name, and writes the small
file the kit's tests check against (infra/schema/google-providers.json):

    {"google": {"version": ..., "resources": {TYPE: BLOCK}, "data": {TYPE: BLOCK}}, "google-beta": {...}}
    BLOCK = {ARGUMENT: {"required": bool, "block": BLOCK or null}}   (a nested block has "block")

Run it again when infra/ uses a new resource type or the pinned packages change:

    .venv/bin/python infra/schema/derive_schema.py [--cache DIR]
"""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

INFRA = Path(__file__).resolve().parents[1]
OUT = Path(__file__).with_name("google-providers.json")
# The last prebuilt packages (HashiCorp stopped publishing them in December 2025): provider 6.50.0.
PACKAGES = {"google": "cdktf-cdktf-provider-google==16.12.1",
            "google-beta": "cdktf-cdktf-provider-google-beta==16.12.1"}
LINK = re.compile(r"registry\.terraform\.io/providers/hashicorp/(google(?:-beta)?)/([\d.]+)/docs/"
                  r"(resources|data-sources)/(?:google_)?(\w+)#(\w+)")


def used_types() -> dict[str, set[str]]:
    """{"resource": {...}, "data": {...}}: every type a block of infra/ names."""
    text = "\n".join(p.read_text() for p in [*INFRA.glob("*.tf"), *INFRA.glob("modules/*/*.tf")])
    return {kind: set(re.findall(rf'^\s*{kind}\s+"(\w+)"', text, re.M)) for kind in ("resource", "data")}


def wheel(spec: str, cache: Path) -> Path:
    name = spec.split("==")[0].replace("-", "_")
    found = sorted(cache.glob(f"{name}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", spec, "-d", str(cache)],
                       check=True)
        found = sorted(cache.glob(f"{name}-*.whl"))
    return found[-1]


def jsii_types(path: Path) -> dict:
    with zipfile.ZipFile(path) as whl:
        inner = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(inner))) as tgz:
            return json.load(tgz.extractfile("package/.jsii"))["types"]


def _block(types: dict, fqn: str, depth: int = 0) -> dict:
    out = {}
    for prop in types[fqn].get("properties", []):
        m = LINK.search(prop.get("docs", {}).get("remarks", ""))
        name = m.group(5) if m else re.sub(r"(?<!^)(?=[A-Z])", "_", prop["name"]).lower()
        nested = [f for f in re.findall(r'"fqn": "([^"]+)"', json.dumps(prop["type"]))
                  if f in types and types[f].get("datatype") and f != fqn]
        block = _block(types, nested[0], depth + 1) if nested and depth < 8 else None
        out[name] = {"required": not prop.get("optional", False), "block": block}
    return out


def derive(types: dict, wanted: dict[str, set[str]]) -> dict:
    found = {"resource": {}, "data": {}}
    version = None
    for fqn, t in types.items():
        if not (t.get("datatype") and fqn.endswith("Config") and "cdktf.TerraformMetaArguments" in t.get("interfaces", [])):
            continue
        links = [LINK.search(p.get("docs", {}).get("remarks", "")) for p in t.get("properties", [])]
        link = next((m for m in links if m), None)
        if not link:
            continue
        version = link.group(2)
        kind = "resource" if link.group(3) == "resources" else "data"
        rtype = "google_" + link.group(4)
        if rtype in wanted[kind]:
            found[kind][rtype] = _block(types, fqn)
    return {"version": version, "resources": found["resource"], "data": found["data"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "labkit-cdktf",
                        help="where the provider packages are downloaded (outside the repository)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    wanted = used_types()
    schema = {}
    for provider, spec in PACKAGES.items():
        schema[provider] = {"package": spec, **derive(jsii_types(wheel(spec, args.cache)), wanted)}
    missing = [(kind, t) for kind, ts in wanted.items() for t in ts
               if not any(t in schema[p]["resources" if kind == "resource" else "data"] for p in schema)]
    if missing:
        print(f"not in either provider: {missing}", file=sys.stderr)
        return 1
    args.out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    print(f"{args.out}: {sum(len(s['resources']) + len(s['data']) for s in schema.values())} types")
    return 0


if __name__ == "__main__":
    sys.exit(main())
