"""The options of the benchmark scripts that trace FPA (op_trace.py, compile_profile.py,
hlo_op_count.py, kernel_op_count.py, gradient_check_gpu.py) for its backward's module
switch, set before anything is traced:

    --field-passes kernels|by_level|all_levels|spread_kernel
                  mixer_kernels/mosaic_gpu/attention/fields.py FIELD_PASSES

    add(parser)     adds it (unset: the library's choice)
    apply(args)     sets the switch if it was given
"""


def add(parser):
    from mixer_kernels.mosaic_gpu.attention.fields import PASSES
    parser.add_argument("--field-passes", choices=PASSES,
                        default=None, help="FPA: how the field passes are formed "
                        "(mixer_kernels/mosaic_gpu/attention/fields.py FIELD_PASSES; unset: the "
                        "library's)")


def apply(args):
    if args.field_passes is not None:
        from mixer_kernels.mosaic_gpu.attention import fields
        fields.FIELD_PASSES = args.field_passes
