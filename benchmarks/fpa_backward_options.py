"""The options of the benchmark scripts that trace FPA (op_trace.py, compile_profile.py,
hlo_op_count.py, kernel_op_count.py, gradient_check_gpu.py) for its backward's module
switches, set before anything is traced:

    --field-passes kernels|by_level|all_levels   mixer_kernels/mosaic_gpu/attention/fields.py
                                                  FIELD_PASSES
    --dkv-query-min on|off                        mixer_kernels/mosaic_gpu/attention/backward.py
                                                  DKV_QUERY_MIN_PATH

    add(parser)     adds them (unset: the library's choice)
    apply(args)     sets the switches that were given
"""


def add(parser):
    parser.add_argument("--field-passes", choices=("kernels", "by_level", "all_levels"),
                        default=None, help="FPA: how the field passes are formed "
                        "(mixer_kernels/mosaic_gpu/attention/fields.py FIELD_PASSES; unset: the "
                        "library's)")
    parser.add_argument("--dkv-query-min", choices=("on", "off"), default=None,
                        help="FPA: whether the dk/dv sweep also takes the query-minimum share "
                        "path (mixer_kernels/mosaic_gpu/attention/backward.py "
                        "DKV_QUERY_MIN_PATH; unset: the library's)")


def apply(args):
    if args.field_passes is not None:
        from mixer_kernels.mosaic_gpu.attention import fields
        fields.FIELD_PASSES = args.field_passes
    if args.dkv_query_min is not None:
        from mixer_kernels.mosaic_gpu.attention import backward
        backward.DKV_QUERY_MIN_PATH = args.dkv_query_min == "on"
