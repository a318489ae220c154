"""Hand-written modules XLA's parser rejects, one per rule, with where our parser must point.

Each entry: name -> (module text, line, column, words the message must contain, XLA's verdict)
where the verdict is "rejects" (XLA's parser refuses it: checked by the tests), "aborts"
(XLA's parser or compiler crashes the process on it, or runs out of memory, so it is not
asked), "compile" (XLA's parser takes it and XLA's compiler refuses it; ours refuses it at
the parser, like the verifier), or "limit" (XLA takes it; it exceeds one of hlo-passes'
documented resource limits, parse/limits.py).
"""

HEAD = "HloModule m\n\n"
ADD = "add {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n  ROOT s = f32[] add(x, y)\n}\n\n"


def entry(body: str, header: str = HEAD, before: str = "") -> str:
    return header + before + "ENTRY e {\n" + body + "\n}\n"


def constant(shape: str, literal: str) -> str:
    return entry(f"  ROOT c = {shape} constant({literal})")


SCAN_BODY = ("body {{\n  c = f32[] parameter(0)\n  x = f32[] parameter(1)\n{extra}"
             "  ROOT t = (f32[], f32[]) tuple(c, x)\n}}\n\n")


def scan(extra: str = "", carries: int = 1) -> str:
    return entry("  x = f32[4] parameter(0)\n  c = f32[] parameter(1)\n"
                 f"  ROOT s = (f32[], f32[4]) scan(c, x), dimensions={{0}}, to_apply=body, num_carries={carries}",
                 before=SCAN_BODY.format(extra=extra))


CASES = {
    # ------------------------------------------------------------ literals --
    "literal_rank_too_low": (constant("f32[2,2]", "{1, 2, 3, 4}"), 4, 41, ["expects 2 elements"], "rejects"),
    "literal_rank_too_high": (constant("s32[3]", "{{1}, 2, 3}"), 4, 29, ["rank 1, but sees larger"], "rejects"),
    "literal_too_few": (constant("s32[3]", "{7, 8}"), 4, 33, ["expects 3 elements", "sees 2"], "rejects"),
    "literal_too_many_inner": (constant("f32[2,2]", "{{1, 2, 3}, {4, 5}}"), 4, 38, ["expects 2 elements"],
                               "rejects"),
    "literal_dots_nested": (constant("f32[2,2]", "{{...}, {...}}"), 4, 32, ["`...` at nest level 1"], "rejects"),
    "literal_scalar_braces": (constant("f32[]", "{5}"), 4, 27, ["rank 0, but sees larger"], "rejects"),
    "literal_decimal_for_int": (constant("s16[]", "2.5"), 4, 27, ["expects integer for primitive type: S16"],
                                "rejects"),
    "literal_plus_sign": (constant("f32[]", "+1"), 4, 27, ["expected"], "rejects"),
    "f16_overflow": (constant("f16[2]", "{1, 70000}"), 4, 32, ["70000 is out of range", "F16"], "rejects"),
    "bf16_overflow": (constant("bf16[]", "-5e38"), 4, 28, ["out of range", "BF16"], "rejects"),
    "f32_overflow": (constant("f32[]", "3.5e38"), 4, 27, ["out of range", "F32"], "rejects"),
    "f64_overflow": (constant("f64[]", "2.5e308"), 4, 27, ["out of range for double"], "rejects"),
    "f8e4m3fn_overflow": (constant("f8e4m3fn[]", "500"), 4, 32, ["out of range", "F8E4M3FN"], "rejects"),
    "u4_overflow": (constant("u4[2]", "{3, 17}"), 4, 31, ["17 is out of range", "U4"], "rejects"),
    "u4_underflow": (constant("u4[]", "-2"), 4, 26, ["-2 is out of range", "U4"], "rejects"),
    "s4_overflow": (constant("s4[]", "9"), 4, 26, ["9 is out of range", "S4"], "rejects"),
    "s4_underflow": (constant("s4[]", "-12"), 4, 26, ["-12 is out of range", "S4"], "rejects"),
    "u16_underflow": (constant("u16[]", "-7"), 4, 27, ["-7 is out of range", "U16"], "rejects"),
    "u32_overflow": (constant("u32[]", "5000000000"), 4, 27, ["out of range", "U32"], "rejects"),
    "s8_overflow": (constant("s8[]", "128"), 4, 26, ["128 is out of range", "S8"], "rejects"),
    "int_beyond_64_bits": (constant("s64[]", "20000000000000000000"), 4, 27, ["does not fit in 64 bits"],
                           "rejects"),
    "complex_overflow": (constant("c64[]", "(4e38, 0)"), 4, 28, ["real part", "out of range"], "rejects"),
    "complex_underflow": (constant("c64[]", "(0, -4e38)"), 4, 31, ["imaginary part", "out of range"], "rejects"),
    "complex_without_parens": (constant("c64[]", "3"), 4, 27, ["complex values are written"], "rejects"),
    "nan_payload_too_wide_f16": (constant("f16[]", "nan(0x401)"), 4, 27, ["NaN payload", "out of range"],
                                 "rejects"),
    "nan_payload_too_wide_bf16": (constant("bf16[]", "-nan(0x100)"), 4, 28, ["NaN payload"], "rejects"),
    "nan_payload_unsupported": (constant("f8e4m3fnuz[]", "nan(0x3)"), 4, 34, ["does not support payloads"],
                                "rejects"),
    "nan_payload_zero": (constant("f32[]", "nan(0x0)"), 4, 27, ["NaN payload"], "rejects"),
    "bool_for_float": (constant("f32[]", "false"), 4, 27, ["expects a number"], "aborts"),
    "token_constant": (constant("token[]", "0"), 4, 29, ["no literal"], "aborts"),
    # -------------------------------------------------------------- tables --
    "tables_out_of_order": (HEAD + 'FileNames\n1 "a.py"\n\nFileLocations\n'
                            + "1 {file_name_id=1 function_name_id=1 line=3 end_line=3 column=1 end_column=9}\n\n"
                            + 'FunctionNames\n1 "f"\n\nStackFrames\n1 {file_location_id=1 parent_frame_id=0}\n\n'
                            + "ENTRY e {\n  ROOT p = f32[] parameter(0)\n}\n", 6, 1, ["expects FunctionNames"], "rejects"),
    "table_record_misspelled": (HEAD + 'FileNames\n1 "a.py"\n\nFunctionNames\n1 "f"\n\nFileLocations\n'
                                + "1 {file_name_id=1 function_name_id=1 line=3 end_line=3 column=1 end_column=9}\n\n"
                                + "StackFrames\n1 {file_locations_id=1 parent_frame_id=0}\n\n"
                                + "ENTRY e {\n  ROOT p = f32[] parameter(0)\n}\n", 13, 1,
                                ["unexpected field 'file_locations_id'"], "rejects"),
    "table_record_missing_field": (HEAD + 'FileNames\n1 "a.py"\n\nFunctionNames\n1 "f"\n\nFileLocations\n'
                                   + "1 {file_name_id=1 function_name_id=1 line=3 column=1 end_column=9}\n\n"
                                   + "StackFrames\n1 {file_location_id=1 parent_frame_id=0}\n\n"
                                   + "ENTRY e {\n  ROOT p = f32[] parameter(0)\n}\n", 10, 1, ["needs end_line="],
                                   "rejects"),
    "get_dimension_size_out_of_bounds": (entry("  a = f32[4,2] parameter(0)\n  ROOT d = get-dimension-size(a), "
                                               "dimensions={2}"), 5, 12, ["out of bounds"], "rejects"),
    "no_header_signature_first": ("f (x: f32[]) -> f32[] {\n  x = f32[] parameter(0)\n  ROOT n = f32[] negate(x)\n}\n\n"
                                  + "ENTRY e {\n  p = f32[] parameter(0)\n  ROOT r = f32[] call(p), to_apply=f\n}\n",
                                  1, 1, ["must start with ENTRY"], "rejects"),
    "sharding_metadata_malformed": (entry('  ROOT p = f32[8] parameter(0), sharding={devices=[8]<=[8] '
                                          'metadata={op_name="w" /source_file="m.py"}}'), 4, 33,
                                    ["error parsing attribute sharding"], "rejects"),
    # --------------------------------------------------------- module header --
    "alias_missing_colon": (entry("  ROOT p = f32[] parameter(0)", "HloModule m, input_output_alias={ {} (0, {}) }\n\n"),
                            1, 14, ["aliasing"], "rejects"),
    "alias_parameter_not_a_number": (entry("  ROOT p = f32[] parameter(0)",
                                           "HloModule m, input_output_alias={ {}: (first, {}) }\n\n"),
                                     1, 14, ["aliasing"], "rejects"),
    "alias_unknown_kind": (entry("  ROOT p = f32[] parameter(0)",
                                 "HloModule m, input_output_alias={ {}: (0, {}, always-alias) }\n\n"),
                           1, 14, ["aliasing kind"], "rejects"),
    "alias_output_index_missing": (entry("  ROOT p = f32[] parameter(0)",
                                         "HloModule m, input_output_alias={ {2}: (0, {}) }\n\n"),
                                   1, 14, ["output index {2}"], "rejects"),
    "donor_index_not_a_number": (entry("  ROOT p = f32[] parameter(0)", "HloModule m, buffer_donor={ (0, {x}) }\n\n"),
                                 1, 14, ["buffer donor"], "rejects"),
    "donor_without_parens": (entry("  ROOT p = f32[] parameter(0)", "HloModule m, buffer_donor={ 0, {} }\n\n"),
                             1, 14, ["buffer donor"], "rejects"),
    "module_attribute_unknown": (entry("  ROOT p = f32[] parameter(0)", "HloModule m, replicas=2\n\n"),
                                 1, 14, ["unexpected module attribute 'replicas'"], "rejects"),
    # ----------------------------------------------------------- custom-call --
    "layout_constraints_count": (entry("  a = f32[4]{0} parameter(0)\n  b = f32[2]{0} parameter(1)\n"
                                       '  ROOT c = f32[4]{0} custom-call(a, b), custom_call_target="t", '
                                       "operand_layout_constraints={f32[4]{0}}"),
                                 6, 22, ["expected 2 operand layout constraints, 1 given"], "rejects"),
    "layout_constraints_incompatible": (entry("  a = f32[4]{0} parameter(0)\n"
                                              '  ROOT c = f32[4]{0} custom-call(a), custom_call_target="t", '
                                              "operand_layout_constraints={s32[4]{0}}"),
                                        5, 22, ["not compatible with operand shape"], "rejects"),
    "api_version_unknown": (entry('  a = f32[4] parameter(0)\n  ROOT c = f32[4] custom-call(a), custom_call_target="t", '
                                  "api_version=API_VERSION_NEWEST"), 5, 59, ["api_version", "API_VERSION_NEWEST"],
                            "rejects"),
    "api_version_unspecified": (entry('  a = f32[4] parameter(0)\n  ROOT c = f32[4] custom-call(a), '
                                      'custom_call_target="t", api_version=API_VERSION_UNSPECIFIED'),
                                5, 59, ["api_version"], "rejects"),
    "api_version_missing": (entry('  a = f32[4] parameter(0)\n  ROOT c = f32[4] custom-call(a), custom_call_target="t", '
                                  "api_version="), 6, 1, ["expected"], "rejects"),
    "custom_call_without_target": (entry("  a = f32[4] parameter(0)\n  ROOT c = f32[4] custom-call(a)"), 5, 19,
                                   ["custom_call_target is expected"], "rejects"),
    # ---------------------------------------------------------------- operands --
    "operand_shape_contradicts": (entry("  a = f32[4] parameter(0)\n  ROOT n = f32[4] negate(f32[5] a)"), 5, 33,
                                  ["declared operand shape f32[5]", "f32[4]"], "rejects"),
    "operand_type_contradicts": (entry("  a = f32[4] parameter(0)\n  ROOT n = f32[4] add(s32[4] a, a)"), 5, 30,
                                 ["declared operand shape s32[4]"], "rejects"),
    "use_before_definition": (entry("  ROOT n = f32[4] negate(a)\n  a = f32[4] parameter(0)"), 4, 26,
                              ["'a' is not defined", "above"], "rejects"),
    "computation_after_caller": (entry("  a = f32[4] parameter(0)\n  z = f32[] constant(0)\n"
                                       "  ROOT r = f32[] reduce(a, z), dimensions={0}, to_apply=add") + "\n" + ADD,
                                 6, 48, ["computation 'add' is not defined"], "rejects"),
    "recursive_computation": (HEAD + "f {\n  x = f32[] parameter(0)\n  ROOT c = f32[] call(x), to_apply=f\n}\n\n"
                              + "ENTRY e {\n  p = f32[] parameter(0)\n  ROOT r = f32[] call(p), to_apply=f\n}\n",
                              5, 27, ["computation 'f' is not defined"], "rejects"),
    "control_edge_cycle": (entry("  a = f32[4] parameter(0)\n  b = f32[4] negate(a), control-predecessors={c}\n"
                                 "  ROOT c = f32[4] negate(b)"), 5, 25, ["control predecessor 'c' is not defined"],
                           "rejects"),
    "instruction_cycle": (entry("  a = f32[4] parameter(0)\n  b = f32[4] add(a, c)\n  ROOT c = f32[4] negate(b)"),
                          5, 21, ["'c' is not defined"], "rejects"),
    # ---------------------------------------------------------- attributes --
    "attribute_opcode_does_not_take": (entry("  a = f32[4] parameter(0)\n  ROOT n = f32[4] negate(a), dimensions={0}"),
                                       5, 30, ["unexpected attribute 'dimensions' for negate"], "rejects"),
    "attribute_misspelled": (entry("  a = f32[4] parameter(0)\n  z = f32[] constant(0)\n"
                                   "  ROOT r = f32[] reduce(a, z), dimension={0}, to_apply=add", before=ADD),
                             12, 32, ["unexpected attribute 'dimension'"], "rejects"),
    "reduce_without_to_apply": (entry("  a = f32[4] parameter(0)\n  z = f32[] constant(0)\n"
                                      "  ROOT r = f32[] reduce(a, z), dimensions={0}"),
                                6, 18, ["to_apply is expected"], "rejects"),
    "attribute_bad_value": (entry("  t = (f32[4], f32[]) parameter(0)\n  ROOT g = f32[] get-tuple-element(t), index=one"),
                            5, 40, ["error parsing attribute index"], "rejects"),
    "integer_with_underscore": (entry("  t = (f32[4], f32[]) parameter(0)\n"
                                      "  ROOT g = f32[] get-tuple-element(t), index=0_1"),
                                5, 40, ["error parsing attribute index"], "rejects"),
    "non_ascii_digits": (entry("  t = (f32[4], f32[]) parameter(0)\n  ROOT g = f32[] get-tuple-element(t), index=\u0661"),
                         5, 40, ["error parsing attribute index"], "rejects"),
    "comparison_direction_unknown": (entry("  a = f32[4] parameter(0)\n  ROOT c = pred[4] compare(a, a), direction=LESS"),
                                     5, 35, ["direction", "LESS"], "rejects"),
    "fusion_kind_unknown": (HEAD + "f {\n  x = f32[] parameter(0)\n  ROOT n = f32[] negate(x)\n}\n\n"
                            + "ENTRY e {\n  p = f32[] parameter(0)\n  ROOT r = f32[] fusion(p), kind=kFast, calls=f\n}\n", 10, 29, ["error parsing attribute kind"], "rejects"),
    "metadata_unknown_field": (entry('  ROOT p = f32[] parameter(0), metadata={op_name="a" color="red"}'), 4, 32, ["unknown metadata field 'color'"], "rejects"),
    "result_accuracy_mode": (entry("  a = f32[4] parameter(0)\n  ROOT t = f32[4] tanh(a), result_accuracy={mode=fast}"),
                             5, 28, ["result_accuracy"], "rejects"),
    "result_accuracy_tolerance": (entry("  a = f32[4] parameter(0)\n"
                                        "  ROOT t = f32[4] tanh(a), result_accuracy={tolerance={eps=1}}"),
                                  5, 28, ["result_accuracy"], "rejects"),
    "window_pad_with_interior": (entry("  a = f32[8] parameter(0)\n  z = f32[] constant(0)\n"
                                       "  ROOT r = f32[8] reduce-window(a, z), window={size=3 pad=1_1_0}, to_apply=add",
                                       before=ADD),
                                 12, 40, ["padding_low and padding_high"], "rejects"),
    "window_sizes_disagree": (entry("  a = f32[8,8] parameter(0)\n  z = f32[] constant(0)\n"
                                    "  ROOT r = f32[8,8] reduce-window(a, z), window={size=3x3 stride=1}, to_apply=add",
                                    before=ADD),
                              12, 42, ["same size as 'size='"], "rejects"),
    "dim_labels_repeat": (entry("  a = f32[1,4,2] parameter(0)\n  k = f32[3,2,2] parameter(1)\n"
                                "  ROOT c = f32[1,4,2] convolution(a, k), window={size=3 pad=1_1}, dim_labels=b00_0io->b0f"), 6, 67, ["unique"], "rejects"),
    "padding_not_a_pad": (entry("  a = f32[4] parameter(0)\n  z = f32[] constant(0)\n"
                                "  ROOT p = f32[6] pad(a, z), padding=1"), 6, 30, ["error parsing attribute padding"],
                          "rejects"),
    # ------------------------------------------------------------- shapes --
    "dim_level_type_unknown": (entry("  ROOT p = f32[4,4]{1,0:D(Q,D)} parameter(0)"), 4, 20, ["dim level types"],
                               "rejects"),
    "dense_physical_shape": (entry("  ROOT p = f32[4]{0:P(f32[4])} parameter(0)"), 4, 18, ["physical shape"],
                             "rejects"),
    "layout_rank_mismatch": (entry("  ROOT p = f32[2,3]{0} parameter(0)"), 4, 12, ["minor to major size is 1"],
                             "rejects"),
    "negative_dimension": (entry("  ROOT p = f32[-3] parameter(0)"), 4, 16, ["negative"], "rejects"),
    "huge_dimension": (entry("  ROOT p = f32[" + "9" * 4300 + "] parameter(0)"), 4, 16, ["integer"], "rejects"),
    "token_with_dimensions": (entry("  ROOT p = token[2] parameter(0)"), 4, 12, ["scalar type"], "aborts"),
    # --------------------------------------------------------- conditional --
    "pred_conditional_one_branch": (HEAD + "t {\n  x = f32[] parameter(0)\n  ROOT n = f32[] negate(x)\n}\n\n"
                                    + "ENTRY e {\n  b = pred[] parameter(0)\n  p = f32[] parameter(1)\n"
                                    + "  ROOT r = f32[] conditional(b, p, p), true_computation=t\n}\n", 11, 18, ["false_computation is expected"], "rejects"),
    "pred_conditional_branch_list": (HEAD + "t {\n  x = f32[] parameter(0)\n  ROOT n = f32[] negate(x)\n}\n\n"
                                     + "ENTRY e {\n  b = pred[] parameter(0)\n  p = f32[] parameter(1)\n"
                                     + "  ROOT r = f32[] conditional(b, p, p), branch_computations={t, t}\n}\n", 11, 40, ["unexpected attribute 'branch_computations'"], "rejects"),
    "conditional_vector_selector": (HEAD + "t {\n  x = f32[] parameter(0)\n  ROOT n = f32[] negate(x)\n}\n\n"
                                    + "ENTRY e {\n  b = s32[2] parameter(0)\n  p = f32[] parameter(1)\n"
                                    + "  ROOT r = f32[] conditional(b, p, p), branch_computations={t, t}\n}\n", 11, 18, ["must be a scalar"], "rejects"),
    # --------------------------------------------------------------- async --
    "async_start_flat_shape": (entry('  p = f32[4] parameter(0)\n  s = (f32[4], f32[8], s32[]) custom-call-start(p), '
                                     'custom_call_target="x"\n  ROOT d = f32[8] custom-call-done(s)'), 5, 31, ["((async-operands), async-outputs, state)"], "aborts"),
    "async_done_of_a_tuple": (entry("  p = f32[4] parameter(0)\n  q = s32[] parameter(1)\n"
                                    "  t = ((f32[4]), f32[4], s32[]) tuple(p, p, q)\n"
                                    "  ROOT d = f32[4] negate-done(t)"),
                              7, 19, ["single async op"], "aborts"),
    "async_update_wrong_wrapper": (entry('  p = f32[4] parameter(0)\n  s = ((f32[4]), f32[8], s32[]) custom-call-start(p), '
                                         'custom_call_target="x"\n  u = ((f32[4]), f32[8], s32[]) negate-update(s)\n'
                                         "  ROOT d = f32[8] custom-call-done(u)"), 6, 33, ["wrapped opcode to be custom-call, but got negate"], "rejects"),
    "async_update_shape_differs": (entry('  p = f32[4] parameter(0)\n  s = ((f32[4]), f32[8], s32[]) custom-call-start(p), '
                                         'custom_call_target="x"\n  u = ((f32[4]), f32[8], u32[]) custom-call-update(s)\n'
                                         "  ROOT d = f32[8] custom-call-done(u)"), 6, 33, ["same as the operand shape"], "compile"),
    "async_done_wrong_computation": (HEAD + "w0 {\n  x = f32[4] parameter(0)\n  ROOT n = f32[4] negate(x)\n}\n\n"
                                     + "w1 {\n  x = f32[4] parameter(0)\n  ROOT n = f32[4] negate(x)\n}\n\n"
                                     + "ENTRY e {\n  p = f32[4] parameter(0)\n"
                                     + "  s = ((f32[4]), f32[4], s32[]) async-start(p), calls=w0\n"
                                     + "  ROOT d = f32[4] async-done(s), calls=w1\n}\n", 16, 19, ["async_wrapped_computation to be w0, but got w1"], "rejects"),
    "async_shared_computation": (HEAD + "w {\n  x = f32[4] parameter(0)\n  ROOT n = f32[4] negate(x)\n}\n\n"
                                 + "ENTRY e {\n  p = f32[4] parameter(0)\n"
                                 + "  st0 = ((f32[4]), f32[4], s32[]) async-start(p), calls=w\n"
                                 + "  d0 = f32[4] async-done(st0)\n"
                                 + "  st1 = ((f32[4]), f32[4], s32[]) async-start(p), calls=w\n"
                                 + "  ROOT d1 = f32[4] async-done(st1)\n}\n",
                                 12, 35, ["called by more than one async op"], "compile"),
    # ------------------------------------------------- instructions, misc --
    "shape_missing_where_xla_cannot_infer": (entry("  a = f32[4] parameter(0)\n  ROOT c = convert(a)"), 5, 12,
                                             ["cannot infer shape for opcode: convert"], "rejects"),
    "nested_broadcast_without_dimensions": (entry("  ROOT r = sqrt(f32[4,4] broadcast(f32[4] parameter(0)))"), 4, 26, ["dimensions is expected"], "rejects"),
    "negative_parameter_number": (entry("  ROOT p = f32[] parameter(-1)"), 4, 28, ["parameter number must be >= 0"],
                                  "rejects"),
    "parameter_number_huge": (entry("  ROOT p = f32[] parameter(99999999999999999999)"), 4, 28, ["integer"],
                              "rejects"),
    "parameter_number_twice": (entry("  a = f32[] parameter(0)\n  ROOT b = f32[] parameter(0)"), 5, 28,
                               ["parameter number 0 is used twice"], "rejects"),
    "parameter_replication_count": (entry("  ROOT p = (f32[], f32[]) parameter(0), parameter_replication={true}"), 4, 27, ["2 leaf buffers", "1 elements"], "rejects"),
    "infeed_array_shape": (entry("  t = token[] after-all()\n  ROOT i = f32[4] infeed(t)"), 5, 19,
                           ["non-empty tuple shape"], "rejects"),
    "signature_disagrees_with_root": (HEAD + "ENTRY e (p: f32[4]) -> f32[3] {\n  p = f32[4] parameter(0)\n"
                                      + "  ROOT n = f32[4] negate(p)\n}\n", 3, 7, ["not compatible"], "rejects"),
    "computation_attribute_unknown": (HEAD + "ENTRY e {\n  ROOT p = f32[] parameter(0)\n}, threads=2\n", 5, 4,
                                      ["unexpected attribute 'threads' for a computation"], "rejects"),
    "dynamic_slice_operand_count": (entry("  a = f32[4,4] parameter(0)\n  i = s32[] parameter(1)\n"
                                          "  ROOT d = f32[2,2] dynamic-slice(a, i), dynamic_slice_sizes={2,2}"),
                                    6, 21, ["wrong number of operands"], "rejects"),
    "sort_two_dimensions": (entry("  a = f32[4] parameter(0)\n  ROOT s = f32[4] sort(a), dimensions={0,0}, "
                                  "to_apply=lt", before="lt {\n  x = f32[] parameter(0)\n  y = f32[] parameter(1)\n"
                                                        "  ROOT c = pred[] compare(x, y), direction=LT\n}\n\n"),
                            11, 19, ["exactly one dimension"], "rejects"),
    "replica_groups_too_many_devices": (entry("  a = f32[4] parameter(0)\n"
                                              "  ROOT r = f32[4] all-reduce(a), replica_groups=[1000000000,1]<=[1000000000], "
                                              "to_apply=add", before=ADD),
                                        11, 34, ["MAX_DEVICES"], "aborts"),
    "sharding_too_many_devices": (entry("  ROOT p = f32[4] parameter(0), sharding={devices=[2147483648]<=[2147483648]}"),
                                  4, 33, ["MAX_DEVICES"], "limit"),
    "empty_computation": (HEAD + "ENTRY e {\n}\n", 4, 1, ["expected", "got '}'"], "rejects"),
    # ---------------------------------------------------------------- scan --
    "scan_parameters_mismatch": (scan(extra="  y = f32[] parameter(2)\n"), 13, 28,
                                 ["to match the number of parameters of to_apply"], "rejects"),
    "scan_more_carries_than_operands": (scan(carries=3), 12, 28, ["fewer operands than num_carries"], "rejects"),
    # ---------------------------------------------- whitespace (lexer) ------
    # XLA's lexer skips space, tab, CR and LF only; every other character Python calls whitespace
    # is refused outside strings and comments.
    **{f"whitespace_{name}": (entry(f"  a = f32[4] parameter(0)\n  ROOT n = f32[4] add(a,{ch} a)"), 5, 25,
                              ["unexpected character"], "rejects")
       for name, ch in (("vertical_tab", "\x0b"), ("form_feed", "\x0c"), ("file_separator", "\x1c"),
                        ("group_separator", "\x1d"), ("record_separator", "\x1e"), ("unit_separator", "\x1f"),
                        ("next_line", "\x85"), ("nbsp", "\xa0"), ("line_separator", "\u2028"),
                        ("paragraph_separator", "\u2029"), ("ideographic_space", "\u3000"))},
    "whitespace_form_feed_indent": (entry("  a = f32[4] parameter(0)\n\x0c ROOT n = f32[4] negate(a)"), 5, 1,
                                    ["unexpected character '\\x0c'"], "rejects"),
    # ------------------------------------------- `name=` is one token -------
    "attribute_name_apart_from_equals": (entry('  a = f32[4] parameter(0)\n  ROOT n = f32[4] negate(a), metadata ={op_name="x"}'),
                                         5, 30, ["expects attribute name", "'metadata'"], "rejects"),
    "header_attribute_name_apart_from_equals": ("HloModule m, replica_count =1\n\nENTRY e {\n  ROOT p = f32[] parameter(0)\n}\n",
                                                1, 14, ["expects attribute name", "'replica_count'"], "rejects"),
    "metadata_field_apart_from_equals": (entry('  a = f32[4] parameter(0)\n  ROOT n = f32[4] negate(a), metadata={op_name ="x"}'),
                                         5, 30, ["expects attribute name", "'op_name'"], "rejects"),
    "sharding_devices_apart_from_equals": (entry("  a = f32[8,4] parameter(0)\n  ROOT n = f32[8,4] negate(a), "
                                                 "sharding={ devices = [ 2 , 2 ] 0 , 1 , 2 , 3 }"),
                                           5, 32, ["expects attribute name", "'devices'"], "rejects"),
    "sharding_device_apart_from_equals": (entry("  a = f32[8,4] parameter(0)\n  ROOT n = f32[8,4] negate(a), "
                                                "sharding={maximal device =0}"),
                                          5, 32, ["expects attribute name", "'device'"], "rejects"),
    # ----------------------------------------------------------- strings ----
    "string_hex_escape_takes_every_digit": (entry('  a = f32[4] parameter(0)\n  ROOT n = f32[4] negate(a), metadata={op_name="a\\x41b"}'),
                                            5, 30, ["\\x41b exceeds 0xff"], "rejects"),
    "string_hex_escape_without_digits": (entry('  a = f32[4] parameter(0)\n  ROOT n = f32[4] negate(a), metadata={op_name="\\xg"}'),
                                         5, 30, ["hex digits"], "rejects"),
    "string_octal_escape_too_large": (entry('  a = f32[4] parameter(0)\n  ROOT n = f32[4] negate(a), metadata={op_name="\\400"}'),
                                      5, 30, ["\\400 exceeds 0xff"], "rejects"),
    "string_short_unicode_escape": (entry('  a = f32[4] parameter(0)\n  ROOT n = f32[4] negate(a), metadata={op_name="\\u41"}'),
                                    5, 30, ["4 hex digits"], "rejects"),
    "string_backslash_newline": (entry('  a = f32[4] parameter(0)\n  ROOT n = f32[4] negate(a), metadata={op_name="a\\\nb"}'),
                                 5, 48, ["unexpected character '\"'"], "rejects"),
    # ------------------------------------------------- iota device lists ----
    "sharding_iota_reshape_without_transpose": (entry("  a = f32[8,4] parameter(0)\n  ROOT n = f32[8,4] negate(a), "
                                                      "sharding={devices=[2,2]<=[2,2]}"),
                                                5, 32, ["expected 'T('"], "rejects"),
    "replica_groups_iota_reshape_without_transpose": (entry("  a = f32[4] parameter(0)\n  ROOT r = f32[4] all-reduce(a), "
                                                            "replica_groups=[2,2]<=[2,2], to_apply=add", before=ADD),
                                                      11, 34, ["expected 'T('"], "rejects"),
    "last_tile_dims_more_than_tile_dims": (entry("  a = f32[8,4] parameter(0)\n  ROOT n = f32[8,4] negate(a), "
                                                 "sharding={devices=[2,2]<=[4] last_tile_dims={manual, replicated, manual}}"),
                                           5, 32, ["3 subgroup dimensions", "2 dimensions of the tile assignment"],
                                           "aborts"),  # XLA: std::bad_alloc
    # ------------------------------------------------------------ meshes ----
    "mesh_duplicate_axis": (entry("  a = f32[8,4] parameter(0)\n  ROOT n = f32[8,4] negate(a), "
                                  "sharding={mesh['x'=2,'x'=2], [{'x'}, {}]}"),
                            5, 32, ["duplicate axis names: 'x'"], "aborts"),  # XLA: a CHECK failure
    "replica_groups_mesh_duplicate_axis": (entry("  a = f32[4] parameter(0)\n  ROOT r = f32[4] all-reduce(a), "
                                                 "replica_groups=mesh['x'=2,'x'=2] {'x'}, to_apply=add", before=ADD),
                                           11, 34, ["duplicate axis names: 'x'"], "aborts"),
    "mesh_axis_of_size_zero": (entry("  a = f32[8,4] parameter(0)\n  ROOT n = f32[8,4] negate(a), "
                                     "sharding={mesh['x'=0], [{'x'}, {}]}"),
                               5, 32, ["mesh axis 'x' has size 0"], "aborts"),  # XLA's parser takes it; Mesh aborts
    # ------------------------------------------------------ operand counts --
    "rng_bit_generator_two_operands": (entry("  s = u64[2] parameter(0)\n  ROOT r = (u64[2], u32[8]) "
                                             "rng-bit-generator(s, s), algorithm=rng_default"),
                                       5, 29, ["expects 1 operand", "has 2 operands"], "rejects"),
    "dynamic_reshape_without_sizes": (entry("  a = f32[4] parameter(0)\n  ROOT r = f32[4] dynamic-reshape(a)"), 5, 19,
                                      ["one dim size operand per result dimension", "got 0 for 1"], "rejects"),
    "recv_done_of_an_array": (entry("  a = f32[4] parameter(0)\n  ROOT r = f32[4] recv-done(a), channel_id=1"), 5, 19,
                              ["recv-done's operand must be a recv"], "aborts"),  # XLA: a CHECK failure
    # ------------------------------------------------------ shapes, layouts -
    "constant_byte_size_overflow": (constant("f32[2000000000,2000000000]", "{...}"), 4, 39,
                                    ["overflow in static extent product"], "rejects"),
    "dimension_beyond_int64": (entry("  ROOT p = f32[9223372036854775808] parameter(0)"), 4, 16,
                               ["9223372036854775808 exceeds the largest 64-bit integer"], "rejects"),
    "tile_dimension_negative": (entry("  ROOT p = f32[8,4]{1,0:T(-8,128)} parameter(0)"), 4, 20,
                                ["tile dimension -8 is negative"], "aborts"),  # XLA: a CHECK failure
    "layout_dimension_negative": (entry("  ROOT p = f32[8,4]{1,-1} parameter(0)"), 4, 12,
                                  ["names a dimension outside 0..1"], "compile"),
    "tuple_shape_too_deep": (entry("  ROOT p = " + "(" * 300 + "f32[]" + ")" * 300 + " parameter(0)"), 4, 268,
                             ["MAX_TUPLE_DEPTH"], "limit"),
    # ------------------------------------------ messages of typed values ----
    "unbalanced_brace_after_string": (entry('  a = f32[4] parameter(0)\n  ROOT n = f32[4] negate(a), '
                                            'backend_config={"a":"}}"}}'), 6, 1, ["got '}'"], "rejects"),
    "frontend_attribute_bare_value": (entry("  a = f32[4] parameter(0)\n  ROOT n = f32[4] negate(a), "
                                            "frontend_attributes={a=b}"), 5, 30, ["got 'b'"], "rejects"),
    "sharding_unknown_kind": (entry("  a = f32[4] parameter(0)\n  ROOT n = f32[4] negate(a), sharding={bogus}"), 5, 30,
                              ["expected one of", "got 'bogus'"], "rejects"),
    "replica_groups_nested_three_deep": (entry("  a = f32[4] parameter(0)\n  ROOT r = f32[4] all-reduce(a), "
                                               "replica_groups={{{0}}}, to_apply=add", before=ADD),
                                         11, 34, ["got '{0}'"], "rejects"),
}
