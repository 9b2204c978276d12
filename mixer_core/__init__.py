"""The ground floor under the mixers' ops and kernels: the dispatch registry (`registry`), value
range checks (`ranges`), time padding (`padding`), the GPU-interpreter switch (`interpret`), the
mesh axes and the shard_map call (`shard`) and the delta rule's shared math (`delta_rule_math`).
It imports nothing from the packages above it (kernels, fpa_jax, gdn_jax, train)."""
