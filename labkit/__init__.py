"""The kit: run JAX SPMD lab notebooks on several device configurations and judge them."""

import sys

# jsonschema (under nbformat, so under papermill) imports its optional IRI format checker when it
# is installed (Jupyter's server extensions pull it in), and that import alone builds a grammar
# for about a second. No schema the kit validates uses the format, so the kit's processes (the one
# running papermill included) go without it.
sys.modules.setdefault("rfc3987_syntax", None)
