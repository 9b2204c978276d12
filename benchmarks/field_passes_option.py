"""The `--field-passes` option of the benchmark scripts that trace FPA (op_trace.py,
compile_profile.py, hlo_op_count.py): mixer_kernels/mosaic_gpu/attention/fields.py
FIELD_PASSES, set before anything is traced.

    add(parser)     adds --field-passes kernels|by_level|all_levels (unset: the library's form)
    apply(args)     sets FIELD_PASSES when the option was given
"""


def add(parser):
    parser.add_argument("--field-passes", choices=("kernels", "by_level", "all_levels"),
                        default=None, help="FPA: how the field passes are formed (mixer_kernels/mosaic_gpu/"
                             "attention/fields.py FIELD_PASSES; unset: the library's)")


def apply(args):
    if args.field_passes is not None:
        from mixer_kernels.mosaic_gpu.attention import fields
        fields.FIELD_PASSES = args.field_passes
