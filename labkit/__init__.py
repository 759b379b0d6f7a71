"""The kit: run JAX SPMD lab notebooks on several device configurations and judge them."""
