"""Which piece of the short-conv kernel differs between the GPU and the interpreter."""
import sys, os
sys.path.insert(0, os.getcwd())
import jax, jax.numpy as jnp, numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from mixer_kernels.mosaic_gpu.common import swizzled_smem
PAD, n, D, W = 8, 64, 64, 4

def pieces(xp, idsp, dy, taps, optimized):
    def kernel(x_ref, ids_ref, dy_ref, taps_ref, ox, oi, ot, od, os_, x_s, ids_s, dy_s, taps_s, t_s, v_s, bar):
        for s in range(W):
            plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(PAD - s, n)], x_s.at[s], bar.at[0])
        plgpu.copy_gmem_to_smem(ids_ref.at[pl.ds(0, PAD + n)], ids_s, bar.at[0])
        plgpu.copy_gmem_to_smem(dy_ref, dy_s, bar.at[0])
        plgpu.copy_gmem_to_smem(taps_ref, taps_s, bar.at[0])
        plgpu.barrier_wait(bar.at[0])
        shape = (n, D)
        for s in range(W):
            xv = plgpu.load(x_s.at[s], layout=plgpu.Layout.WGMMA, optimized=optimized)
            t_s[...] = xv.astype(jnp.float32); plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(t_s, ox.at[s]); plgpu.wait_smem_to_gmem(0)
            iv = lax.broadcast_in_dim(plgpu.load(ids_s.at[pl.ds(PAD - s, n)], layout=plgpu.Layout.WGMMA.reduce(1)), shape, [0])
            t_s[...] = iv; plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(t_s, oi.at[s]); plgpu.wait_smem_to_gmem(0)
            tv = lax.broadcast_in_dim(plgpu.load(taps_s.at[s], layout=plgpu.Layout.WGMMA.reduce(0)), shape, [1])
            t_s[...] = tv; plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(t_s, ot.at[s]); plgpu.wait_smem_to_gmem(0)
            v_s.at[s][...] = jnp.sum(xv.astype(jnp.float32), axis=0)
        t_s[...] = dy_s[...].astype(jnp.float32); plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(t_s, od); plgpu.copy_smem_to_gmem(v_s, os_); plgpu.wait_smem_to_gmem(0)
    f32 = jnp.float32
    out = (jax.ShapeDtypeStruct((W, n, D), f32),) * 3 + (jax.ShapeDtypeStruct((n, D), f32), jax.ShapeDtypeStruct((W, D), f32))
    scratch = (plgpu.SMEM((W, n, D), xp.dtype), plgpu.SMEM((PAD + n,), f32), swizzled_smem((n, D), dy.dtype),
               plgpu.SMEM((W, D), f32), swizzled_smem((n, D), f32), plgpu.SMEM((W, D), f32), plgpu.Barrier(num_arrivals=3 + W, num_barriers=1))
    return plgpu.kernel(kernel, out_type=out, scratch_types=scratch, grid=(1,), grid_names=("g",))(xp, idsp, dy, taps)

rng = np.random.default_rng(0)
xp = jnp.asarray(rng.standard_normal((PAD + n, D)), jnp.bfloat16)
idsp = jnp.asarray(np.arange(PAD + n), jnp.float32)
dy = jnp.asarray(rng.standard_normal((n, D)), jnp.bfloat16)
taps = jnp.asarray(rng.standard_normal((W, D)), jnp.float32)
for optimized in (False, True):
    try:
        ox, oi, ot, od, osum = jax.jit(lambda *a: pieces(*a, optimized))(xp, idsp, dy, taps)
    except Exception as e:
        print("optimized", optimized, "failed:", repr(e)[:200]); continue
    x32 = np.asarray(xp, np.float32)
    for s in range(W):
        ex = x32[PAD - s:PAD - s + n]
        print(f"opt={optimized} s={s} x {np.abs(np.asarray(ox[s]) - ex).max():.2e} ids {np.abs(np.asarray(oi[s]) - np.arange(PAD - s, PAD - s + n)[:, None]).max():.2e} "
              f"taps {np.abs(np.asarray(ot[s]) - np.asarray(taps[s])[None]).max():.2e} sum0 {np.abs(np.asarray(osum[s]) - ex.sum(0)).max():.2e}")
    print("dy", np.abs(np.asarray(od) - np.asarray(dy, np.float32)).max())
