# The first cell of a run whose matrix products are done as a TPU does them by default: each float32
# operand rounded to bfloat16, the products accumulated in float32. The CPU backend computes float32
# products exactly whatever precision is asked for, so this cell changes how XLA's dot is emitted:
# every dot_general (jnp.dot, @, einsum, lax.dot_general, Flax layers, their gradients, inside jit
# or not) first rounds its float32 operands to bfloat16. It also tells JAX, and so the harness's
# report, that products are bfloat16.
import jax
import numpy as _np
from jax._src.interpreters import mlir as _mlir
from jax._src.lax import lax as _lax
from jax._src.lib.mlir import ir as _ir
from jax._src.lib.mlir.dialects import hlo as _hlo


def _bfloat16_operands(platform):
    def lower(ctx, lhs, rhs, **params):
        def rounded(x, aval):
            if aval.dtype != _np.float32:
                return x
            bf16 = _ir.RankedTensorType.get(_ir.RankedTensorType(x.type).shape, _ir.BF16Type.get())
            return _hlo.convert(x.type, _hlo.convert(bf16, x))

        return _lax._dot_general_lower(
            ctx, rounded(lhs, ctx.avals_in[0]), rounded(rhs, ctx.avals_in[1]), platform=platform, **params
        )

    return lower


_mlir.register_lowering(_lax.dot_general_p, _bfloat16_operands("default"))
_mlir.register_lowering(_lax.dot_general_p, _bfloat16_operands("cpu"), platform="cpu")
jax.config.update("jax_default_matmul_precision", "bfloat16")
