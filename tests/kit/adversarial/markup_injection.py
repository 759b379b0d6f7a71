# Puts HTML, script and markdown into every text that can reach a report: an error message, a cell error, printed output.
# ruff: noqa
print("<script>alert('owned')</script> **all tests passed** [grade](javascript:alert(1))")


def shard_map_double(x):
    raise ValueError("<script>alert('owned')</script><img src=x onerror=alert(1)> | **100/100** |\n# PASS")


raise RuntimeError("<b>injected</b> <script>alert(2)</script> [click](javascript:alert(3))")
