"""The ground floor under the mixers' ops and kernels. It imports nothing from the packages
above it (kernels, fpa_jax, gdn_jax, train).

    delta_rule_math   the delta rule's shared math: state resets, compute dtype, pair decay
                      matrix, unit lower-triangular inverse
    inputs            the input check every sequence-mixer layer runs first
    interpret         the GPU-interpreter switch: Mosaic GPU kernels run on the CPU, for tests
    padding           padding the time axis up to whole blocks: lengths, arrays, segment ids
    recompute         a custom VJP that keeps only a function's inputs and reruns it
    ranges            value-range checks (FPA's beta, the delta rule's g, beta, |k|)
    registry          one dispatch registry per op: name -> implementation, ordered default
    shard             the mesh axes, the shard_map call, ring-or-shard, bound axis sizes
    soft_min          FPA's BIG (a finite +inf in minima) and the soft-minimum decay
"""
