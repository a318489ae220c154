"""Hand-written HLO modules, one per syntax feature of the text language.

Each entry: name -> (what it guards, module text).  Every text is accepted by
XLA's own parser; the tests check our round trip against XLA's canonical print.
"""

ADD = """
HloModule m

add {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT a = f32[] add(x, y)
}
"""

CASES = {
    "header_attributes": ("module header attributes of every kind", """
HloModule m, is_scheduled=true, entry_computation_layout={(f32[4]{0}, f32[4]{0})->f32[4]{0}}, replica_count=1, num_partitions=1, input_output_alias={ {}: (0, {}, may-alias) }, alias_passthrough_params=true, frontend_attributes={attr_a="1",attr_b="x y"}, allow_spmd_sharding_propagation_to_parameters={false,true}, allow_spmd_sharding_propagation_to_output={true}

ENTRY e {
  p = f32[4] parameter(0)
  q = f32[4] parameter(1)
  ROOT a = f32[4] add(p, q)
}
"""),
    "buffer_donor": ("buffer_donor header attribute", """
HloModule m, buffer_donor={ (0, {}) }

ENTRY e {
  p = f32[4] parameter(0)
  ROOT n = f32[4] negate(p)
}
"""),
    "signatures_and_percent_names": ("computations with signatures, %-names, ROOT not last", """
HloModule m

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %a = f32[] add(f32[] %x, f32[] %y)
}

ENTRY %e (p: f32[4,8], t: (f32[], s32[])) -> f32[4] {
  %p = f32[4,8]{1,0} parameter(0)
  %t = (f32[], s32[]) parameter(1)
  %z = f32[] get-tuple-element((f32[], s32[]) %t), index=0
  ROOT %r = f32[4]{0} reduce(f32[4,8]{1,0} %p, f32[] %z), dimensions={1}, to_apply=%add
  %unused = s32[] get-tuple-element(%t), index=1
}
"""),
    "debug_tables": ("FileNames/FunctionNames/FileLocations/StackFrames tables and stack_frame_id", """
HloModule m

FileNames
1 "/tmp/model.py"
2 "lib/ops.py"

FunctionNames
1 "<module>"
2 "f"

FileLocations
1 {file_name_id=1 function_name_id=1 line=9 end_line=9 column=4 end_column=4}
2 {file_name_id=2 function_name_id=2 line=6 end_line=6 column=28 end_column=30}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=1}

ENTRY e {
  p = f32[4] parameter(0), metadata={op_name="x"}
  ROOT n = f32[4] negate(p), metadata={op_type="neg" op_name="jit(f)/neg" stack_frame_id=2}
}
"""),
    "element_types": ("every element type, token and opaque", """
HloModule m

ENTRY e {
  a = pred[2] parameter(0)
  b = s2[2] parameter(1)
  c = s4[2] parameter(2)
  d = s8[2] parameter(3)
  e1 = s16[2] parameter(4)
  f = s32[2] parameter(5)
  g = s64[2] parameter(6)
  h = u2[2] parameter(7)
  i = u4[2] parameter(8)
  j = u8[2] parameter(9)
  k = u16[2] parameter(10)
  l = u32[2] parameter(11)
  n = u64[2] parameter(12)
  o = f4e2m1fn[2] parameter(13)
  q = f8e3m4[2] parameter(14)
  r = f8e4m3[2] parameter(15)
  s = f8e4m3fn[2] parameter(16)
  t = f8e4m3b11fnuz[2] parameter(17)
  u = f8e4m3fnuz[2] parameter(18)
  v = f8e5m2[2] parameter(19)
  w = f8e5m2fnuz[2] parameter(20)
  x = f8e8m0fnu[2] parameter(21)
  y = bf16[2] parameter(22)
  z = f16[2] parameter(23)
  aa = f32[2] parameter(24)
  bb = f64[2] parameter(25)
  cc = c64[2] parameter(26)
  dd = c128[2] parameter(27)
  tok = token[] after-all()
  ROOT tup = (pred[2], s2[2], s4[2], s8[2], s16[2], /*index=5*/s32[2], s64[2], u2[2], u4[2], u8[2], /*index=10*/u16[2], u32[2], u64[2], f4e2m1fn[2], f8e3m4[2], /*index=15*/f8e4m3[2], f8e4m3fn[2], f8e4m3b11fnuz[2], f8e4m3fnuz[2], f8e5m2[2], /*index=20*/f8e5m2fnuz[2], f8e8m0fnu[2], bf16[2], f16[2], f32[2], /*index=25*/f64[2], c64[2], c128[2], token[]) tuple(a, b, c, d, e1, /*index=5*/f, g, h, i, j, /*index=10*/k, l, n, o, q, /*index=15*/r, s, t, u, v, /*index=20*/w, x, y, z, aa, /*index=25*/bb, cc, dd, tok)
}
"""),
    "dynamic_dims_and_layouts": ("bounded dynamic dims, tiled layouts with memory space and element size", """
HloModule m

ENTRY e {
  p = f32[<=8,4]{1,0} parameter(0)
  q = f32[8,128]{1,0:T(8,128)} parameter(1)
  r = bf16[16,256]{1,0:T(8,128)(2,1)S(1)} parameter(2)
  s = s4[64]{0:T(64)E(4)} parameter(3)
  ROOT t = (f32[<=8,4], f32[8,128], bf16[16,256], s4[64]) tuple(p, q, r, s)
}
"""),
    "sharding_forms": ("every sharding spelling", """
HloModule m

ENTRY e {
  a = f32[8,8] parameter(0), sharding={replicated}
  b = f32[8,8] parameter(1), sharding={maximal device=3}
  c = f32[8,8] parameter(2), sharding={manual}
  d = f32[8,8] parameter(3), sharding={devices=[2,2]0,2,1,3}
  e1 = f32[8,8] parameter(4), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  f = f32[8,8] parameter(5), sharding={devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}
  g = f32[8,8] parameter(6), sharding={devices=[2,1,2,2]<=[8] last_tile_dims={manual, replicated}}
  h = f32[8,8] parameter(7), sharding={devices=[4,2]<=[8] metadata={op_name="w" source_file="m.py" source_line=3}}
  i = f32[8,8] parameter(8), sharding={unknown}
  t = (f32[8,8], f32[8,8]) tuple(a, b), sharding={{replicated}, {devices=[2,1,4]<=[8] last_tile_dim_replicate}}
  ROOT s = (f32[8,8], f32[8,8], f32[8,8], f32[8,8], f32[8,8], f32[8,8], f32[8,8], (f32[8,8], f32[8,8])) tuple(c, d, e1, f, g, h, i, t)
}
"""),
    "one_bit_integers": ("s1/u1 element types (XLA parses them; its StableHLO import cannot run them)", """
HloModule m

ENTRY e {
  p = s1[4] parameter(0)
  q = u1[2,2]{0,1} parameter(1)
  c = s1[2] constant({-1, 0})
  ROOT t = (s1[4], u1[2,2], s1[2]) tuple(p, q, c)
}
"""),
    "named_sharding_forms": ("the named mesh form of shardings newer XLA prints", """
HloModule m

ENTRY e {
  a = f32[8,8] parameter(0), sharding={mesh['x'=4,'y'=2], [{'x'}, {}]}
  b = f32[8,8] parameter(1), sharding={mesh[], replicated}
  c = f32[8,8] parameter(2), sharding={mesh['i'=8], manual}
  d = f32[8,8] parameter(3), sharding={mesh['x'=4,'y'=2], device_ids=(0,2,4,6,1,3,5,7), [{'y'}, {'x', ?}]}
  e1 = f32[8,8] parameter(4), sharding={mesh['x'=4,'y'=2], [{'x':(1)2, 'y'}, {?}], replicated={'x':(2)2}, metadata={op_name="w"}}
  t = (f32[8,8], f32[8,8]) tuple(a, b), sharding={{mesh['x'=4,'y'=2], [{}, {'y'}]}, {mesh[], replicated}}
  ROOT s = (f32[8,8], f32[8,8], f32[8,8], (f32[8,8], f32[8,8])) tuple(c, d, e1, t)
}
"""),
    "replica_groups_and_collectives": ("replica groups as lists, iota and mesh; collectives' attributes", ADD.replace("\nadd {", "\n%sum {") + """
ENTRY e {
  p = f32[8] parameter(0)
  a = f32[8] all-reduce(p), replica_groups={{0,1},{2,3}}, to_apply=%sum
  b = f32[8] all-reduce(p), channel_id=1, replica_groups=[2,4]<=[4,2]T(1,0), use_global_device_ids=true, to_apply=%sum
  c = f32[8] all-reduce(p), channel_id=2, replica_groups=mesh['x'=4,'y'=2] {'x'}, use_global_device_ids=true, to_apply=%sum
  d = f32[16] all-gather(p), channel_id=3, replica_groups=[4,2]<=[8], dimensions={0}, use_global_device_ids=true
  f = f32[4] reduce-scatter(p), channel_id=4, replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}, use_global_device_ids=true, to_apply=%sum
  g = f32[8] collective-permute(p), channel_id=5, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  h = f32[8] all-to-all(p), channel_id=6, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  i = f32[8] all-reduce(p), replica_groups={}, to_apply=%sum
  ROOT t = (f32[8], f32[8], f32[8], f32[16], f32[4], f32[8], f32[8], f32[8]) tuple(a, b, c, d, f, g, h, i)
}
"""),
    "windows_and_convolution": ("window, dim_labels, feature_group_count, reduce-window, select-and-scatter, padding", ADD + """
ge {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT c = pred[] compare(x, y), direction=GE
}

ENTRY e {
  img = f32[1,8,8,4] parameter(0)
  ker = f32[3,3,4,8] parameter(1)
  conv = f32[1,4,4,8] convolution(img, ker), window={size=3x3 stride=2x2 pad=1_1x1_1 lhs_dilate=1x1 rhs_dilate=1x1}, dim_labels=b01f_01io->b01f, operand_precision={highest,default}
  z = f32[] constant(0)
  rw = f32[1,4,4,4] reduce-window(img, z), window={size=1x2x2x1 stride=1x2x2x1}, to_apply=add
  src = f32[1,4,4,4] parameter(2)
  sas = f32[1,8,8,4] select-and-scatter(img, src, z), window={size=1x2x2x1 stride=1x2x2x1}, select=ge, scatter=add
  pd = f32[1,10,16,4] pad(img, z), padding=0_0x1_1x1_0_1x0_0
  ROOT t = (f32[1,4,4,8], f32[1,4,4,4], f32[1,8,8,4], f32[1,10,16,4]) tuple(conv, rw, sas, pd)
}
"""),
    "slices_dots_gather_scatter": ("slice, dynamic-slice, dot/gather/scatter dimension numbers", ADD + """
ENTRY e {
  p = f32[8,16] parameter(0)
  s = f32[4,4] slice(p), slice={[0:8:2], [4:8]}
  i = s32[] parameter(1)
  ds = f32[2,16] dynamic-slice(p, i, i), dynamic_slice_sizes={2,16}
  dus = f32[8,16] dynamic-update-slice(p, ds, i, i)
  lhs = f32[2,8,16] parameter(2)
  rhs = f32[2,16,4] parameter(3)
  dt = f32[2,8,4] dot(lhs, rhs), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}, operand_precision={default,default}
  idx = s32[5,1] parameter(4)
  g = f32[5,16] gather(p, idx), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,16}, indices_are_sorted=true
  upd = f32[5,16] parameter(5)
  sc = f32[8,16] scatter(p, idx, upd), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add, unique_indices=false
  ROOT t = (f32[4,4], f32[8,16], f32[2,8,4], f32[5,16], f32[8,16]) tuple(s, dus, dt, g, sc)
}
"""),
    "custom_calls": ("custom-call strings and JSON backend_config, api_version, aliasing, schedule, side effect, frontend attributes", """
HloModule m

ENTRY e {
  p = f32[8] parameter(0)
  a = f32[8] custom-call(p), custom_call_target="Sharding", sharding={devices=[2]<=[2]}, frontend_attributes={xla.sdy.sharding="#sdy.sharding_per_value<[<@mesh, [{\\"x\\"}]>]>"}
  b = f32[8] custom-call(a), custom_call_target="my_op", api_version=API_VERSION_STATUS_RETURNING, backend_config="opaque,string with, commas", custom_call_has_side_effect=true
  c = f32[8] custom-call(b), custom_call_target="my_op2", output_to_operand_aliasing={{}: (0, {})}, schedule=SCHEDULE_LATEST, backend_config={"key":[1,2],"nested":{"a":"b, c=d"}}
  ROOT d = f32[8] custom-call(c), custom_call_target="my_op3", api_version=API_VERSION_TYPED_FFI, backend_config={}
}
"""),
    "control_flow_and_calls": ("while/conditional/call/fusion, called computations, control-predecessors", ADD + """
cond {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  one = s32[] constant(1)
  j = s32[] add(i, one)
  x = f32[4] get-tuple-element(s), index=1
  y = f32[4] add(x, x)
  ROOT t = (s32[], f32[4]) tuple(j, y)
}

branch0 {
  x = f32[4] parameter(0)
  ROOT n = f32[4] negate(x)
}

branch1 {
  x = f32[4] parameter(0)
  ROOT n = f32[4] exponential(x)
}

fused {
  x = f32[4] parameter(0)
  ROOT m = f32[4] multiply(x, x)
}

ENTRY e {
  p = f32[4] parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[4]) tuple(zero, p)
  w = (s32[], f32[4]) while(init), condition=cond, body=body
  x = f32[4] get-tuple-element(w), index=1
  k = s32[] parameter(1)
  c = f32[4] conditional(k, x, x), branch_computations={branch0, branch1}
  pr = pred[] parameter(2)
  c2 = f32[4] conditional(pr, c, c), true_computation=branch0, false_computation=branch1
  cl = f32[4] call(c2), to_apply=branch0
  f = f32[4] fusion(cl), kind=kLoop, calls=fused
  z = f32[] constant(0)
  r = f32[] reduce(f, z), dimensions={0}, to_apply=add, control-predecessors={cl}
  ROOT t = (f32[4], f32[]) tuple(f, r)
}
"""),
    "async_wrapped": ("async start/done with wrapped computations and async collectives", ADD + """
wrapped {
  x = f32[8] parameter(0)
  ROOT n = f32[8] negate(x)
}

ENTRY e {
  p = f32[8] parameter(0)
  st = ((f32[8]), f32[8], s32[]) async-start(p), calls=wrapped
  dn = f32[8] async-done(st)
  ars = f32[8] all-reduce-start(p), replica_groups={}, to_apply=add
  ard = f32[8] all-reduce-done(ars)
  ags = (f32[8], f32[16]) all-gather-start(p), replica_groups={{0,1}}, dimensions={0}
  agd = f32[16] all-gather-done(ags)
  cps = (f32[8], f32[8], u32[], u32[]) collective-permute-start(p), source_target_pairs={{0,1},{1,0}}
  cpd = f32[8] collective-permute-done(cps)
  ROOT t = (f32[8], f32[8], f32[16], f32[8]) tuple(dn, ard, agd, cpd)
}
"""),
    "constants": ("constants of every element type and nesting, specials, complex, tuples, empty", """
HloModule m

ENTRY e {
  a = f32[3] constant({nan, inf, -inf})
  b = pred[2] constant({true, false})
  c = c64[2] constant({(1, 2), (3.5, -4)})
  d = f32[0] constant({})
  e1 = bf16[2,2] constant({ { 1, 2 }, { 3, 4 } })
  f = s4[2] constant({-1, 7})
  g = f8e4m3fn[2] constant({0.5, 1})
  h = u64[] constant(18446744073709551615)
  i = f64[] constant(1.2345678901234567e-300)
  j = f32[2,0,3] constant({ { }, { } })
  k = (f32[], s32[2]) constant((1.5, {1, 2}))
  l = c128[] constant((0, -1))
  n = s8[2,2,1] constant({ { {1}, {2} }, { {3}, {-4} } })
  o = f16[] constant(-0)
  ROOT t = (f32[3], pred[2], c64[2], f32[0], bf16[2,2], /*index=5*/s4[2], f8e4m3fn[2], u64[], f64[], f32[2,0,3], /*index=10*/(f32[], s32[2]), c128[], s8[2,2,1], f16[]) tuple(a, b, c, d, e1, f, g, h, i, j, k, l, n, o)
}
"""),
    "nested_operands_and_comments": ("nested instructions as operands, // and /* */ comments", """
HloModule m // a comment after the header

// a comment line
ENTRY e {
  p = f32[2] parameter(0) // trailing
  /* before */ q = f32[2] parameter(1)
  ROOT a = f32[2] add(f32[2] p, f32[2] multiply(p, /*index=1*/q))
}
"""),
    "misc_ops": ("iota, rng, sort, topk, bitcast-convert, reduce-precision, rng-bit-generator, partition/replica id, opt-barrier, domain-free ops", """
HloModule m

lt {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = s32[] parameter(2)
  d = s32[] parameter(3)
  ROOT r = pred[] compare(a, b), direction=LT, type=TOTALORDER
}

ENTRY e {
  io = s32[8] iota(), iota_dimension=0
  lo = f32[] constant(0)
  hi = f32[] constant(1)
  rn = f32[8] rng(lo, hi), distribution=rng_uniform
  st = (f32[8], s32[8]) sort(rn, io), dimensions={0}, is_stable=true, to_apply=lt
  tk = (f32[2], s32[2]) topk(rn), k=2, largest=true
  bc = s32[8] bitcast-convert(rn)
  rp = f32[8] reduce-precision(rn), exponent_bits=5, mantissa_bits=10
  key = u64[2] parameter(0)
  rbg = (u64[2], u32[4]) rng-bit-generator(key), algorithm=rng_three_fry
  pid = u32[] partition-id()
  rid = u32[] replica-id()
  ob = (f32[8], s32[8]) opt-barrier(st)
  ROOT t = ((f32[8], s32[8]), (f32[2], s32[2]), s32[8], f32[8], (u64[2], u32[4]), u32[], u32[], (f32[8], s32[8])) tuple(st, tk, bc, rp, rbg, pid, rid, ob)
}
"""),
    "tuple_element_refs": ("`%call#1` operands (XLA's dumps) read as get-tuple-elements", """
HloModule m

body {
  x = f32[4] parameter(0)
  n = f32[4] negate(x)
  ROOT t = (f32[4], f32[4]) tuple(n, x)
}

ENTRY e {
  p = f32[4] parameter(0)
  %call = (f32[4], f32[4]) call(p), to_apply=body
  a = f32[4] copy(%call#0)
  ROOT b = f32[4] add(a, %call#1)
}
"""),
    "no_header": ("text without `HloModule` (XLA names the module after its entry)", ADD.replace("HloModule m", "") + """
ENTRY e {
  p = f32[] parameter(0)
  ROOT a = f32[] add(p, p)
}
"""),
    "computation_attributes": ("execution_thread on computations and async_execution_thread", """
HloModule m

host_fn {
  x = f32[8] parameter(0)
  ROOT n = f32[8] negate(x)
}, execution_thread="host"

ENTRY e {
  p = f32[8] parameter(0)
  st = ((f32[8]), f32[8], s32[]) async-start(p), async_execution_thread="host", calls=host_fn
  ROOT dn = f32[8] async-done(st)
}
"""),
    "scan": ("scan with a carry, its dimension and flags (integer and boolean attributes)", """
HloModule m

body {
  c = f32[] parameter(0)
  x = f32[] parameter(1)
  s = f32[] add(c, x)
  ROOT t = (f32[], f32[]) tuple(s, s)
}

ENTRY e {
  x = f32[4] parameter(0)
  c = f32[] parameter(1)
  ROOT s = (f32[], f32[4]) scan(c, x), dimensions={0}, to_apply=body, num_carries=1, is_reverse=true
}
"""),
    "output_to_operand_aliasing": ("a fusion's and custom-calls' output/operand aliasing: tuple "
                                   "indices, spaces, a trailing comma and the empty list, as XLA reads them", """
HloModule m

fused {
  a = f32[4] parameter(0)
  b = f32[2] parameter(1)
  n = f32[4] negate(a)
  ROOT t = (f32[4], f32[2]) tuple(n, b)
}

ENTRY e {
  p0 = f32[4] parameter(0)
  p1 = (f32[4], f32[2]) parameter(1)
  c = (f32[4], f32[2]) custom-call(p0, p1), custom_call_target="foo", output_to_operand_aliasing={{0}: (1, {0}), {1}: (1, {1})}
  d = f32[4] custom-call(p0), custom_call_target="bar", output_to_operand_aliasing={ {} : ( 0 , { } ), }
  e = f32[4] custom-call(d), custom_call_target="baz", output_to_operand_aliasing={}
  g0 = f32[4] get-tuple-element(c), index=0
  g1 = f32[2] get-tuple-element(c), index=1
  f = (f32[4], f32[2]) fusion(g0, g1), kind=kLoop, calls=fused, output_to_operand_aliasing={{0}: (0, {}), {1}: (1, {})}
  ROOT t = ((f32[4], f32[2]), f32[4]) tuple(f, e)
}
"""),
}

# Forms XLA's parser accepts that hand-written HLO uses: shapes left out (XLA infers them),
# operands written inline with their shapes, the old header colon, async sugar.  Each is
# checked against XLA's own reading (its canonical print of the input).
INFERENCE_CASES = {
    "infer_elementwise": ("shapes inferred for unary, binary, ternary and comparison ops", """
HloModule m

ENTRY e {
  a = f32[3,5] parameter(0)
  b = f32[3,5] parameter(1)
  c = c64[3,5] parameter(2)
  neg = negate(a)
  sum = add(neg, b)
  lt = compare(sum, b), direction=LT
  pick = select(lt, sum, b)
  mag = abs(c)
  re = real(c)
  fin = is-finite(pick)
  lo = f32[] parameter(3)
  clamped = clamp(lo, pick, lo)
  cx = complex(mag, re)
  ROOT t = tuple(clamped, fin, cx)
}
"""),
    "infer_structural": ("tuple, get-tuple-element, broadcast of a scalar, transpose, reverse, pad, concatenate, "
                         "after-all, add-dependency, partition-id, get-dimension-size", """
HloModule m

ENTRY e {
  p = f32[2,3] parameter(0)
  q = f32[4,3] parameter(1)
  s = f32[] parameter(2)
  t = tuple(p, q, s)
  q2 = get-tuple-element(t), index=1
  bs = broadcast(s), dimensions={}
  tr = transpose(p), dimensions={1,0}
  rv = reverse(q2), dimensions={0}
  pd = pad(p, s), padding=1_0x0_2_1
  cc = concatenate(p, q2), dimensions={0}
  tok = after-all()
  dep = add-dependency(cc, tok)
  pid = partition-id()
  rid = replica-id()
  ds = get-dimension-size(q), dimensions={1}
  ROOT out = tuple(bs, tr, rv, pd, dep, pid, rid, ds)
}
"""),
    "infer_dot_mixed_precision": ("dot without a shape: batch and contracting dims, the more precise type", """
HloModule m

ENTRY e {
  a = f32[4,2,3] parameter(0)
  b = bf16[4,3,5] parameter(1)
  ROOT d = dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}
"""),
    "infer_reductions": ("reduce, reduce-window, map, sort and scatter infer from operands and computations", """
HloModule m

sum {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT z = add(x, y)
}

less {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT z = compare(x, y), direction=LT
}

ENTRY e {
  p = f32[6,8] parameter(0)
  zero = f32[] constant(0)
  r = reduce(p, zero), dimensions={1}, to_apply=sum
  w = reduce-window(p, zero), window={size=2x3 stride=2x1 pad=0_0x1_1}, to_apply=sum
  m = map(p, p), dimensions={0,1}, to_apply=sum
  s = sort(p), dimensions={1}, to_apply=less
  idx = s32[2,1] parameter(1)
  upd = f32[2,8] parameter(2)
  sc = scatter(p, idx, upd), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=sum
  ROOT t = tuple(r, w, m, s, sc)
}
"""),
    "infer_control_flow": ("call, while and conditional (pred and indexed) take their callees' shapes", """
HloModule m

double {
  x = f32[4] parameter(0)
  ROOT y = add(x, x)
}

cond {
  t = (s32[], f32[4]) parameter(0)
  i = get-tuple-element(t), index=0
  n = s32[] constant(3)
  ROOT lt = compare(i, n), direction=LT
}

body {
  t = (s32[], f32[4]) parameter(0)
  i = get-tuple-element(t), index=0
  one = s32[] constant(1)
  j = add(i, one)
  v = get-tuple-element(t), index=1
  w = negate(v)
  ROOT u = tuple(j, w)
}

ENTRY e {
  p = f32[4] parameter(0)
  c = call(p), to_apply=double
  zero = s32[] constant(0)
  init = tuple(zero, c)
  loop = while(init), condition=cond, body=body
  flag = pred[] parameter(1)
  branch = conditional(flag, p, c), true_computation=double, false_computation=double
  k = s32[] parameter(2)
  pick = conditional(k, p, c), branch_computations={double, double}
  ROOT t = tuple(loop, branch, pick)
}
"""),
    "infer_convolution_and_gather": ("convolution (strides, padding, dilation, feature groups), gather, "
                                     "select-and-scatter, batch-norm, fft, topk, cholesky, triangular-solve", """
HloModule m

ge {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT z = compare(x, y), direction=GE
}

sum {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT z = add(x, y)
}

ENTRY e {
  img = f32[2,9,9,4] parameter(0)
  ker = f32[3,3,2,6] parameter(1)
  conv = convolution(img, ker), window={size=3x3 stride=2x1 pad=1_1x0_0 rhs_dilate=1x2}, dim_labels=b01f_01io->b01f, feature_group_count=2
  table = f32[10,7] parameter(2)
  ids = s32[5] parameter(3)
  rows = gather(table, ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,7}
  src = f32[2,5,9,4] parameter(4)
  zero = f32[] constant(0)
  grad = select-and-scatter(img, src, zero), window={size=1x3x1x1 stride=1x2x1x1 pad=0_0x1_1x0_0x0_0}, select=ge, scatter=sum
  scale = f32[4] parameter(5)
  bn = batch-norm-training(img, scale, scale), epsilon=0.001, feature_index=3
  sig = f32[3,16] parameter(6)
  spec = fft(sig), fft_type=RFFT, fft_length={16}
  top = topk(table), k=2
  mat = f32[2,4,4] parameter(7)
  chol = cholesky(mat), lower=true
  sol = triangular-solve(mat, mat), left_side=true, lower=true, transpose_a=NO_TRANSPOSE
  ROOT t = tuple(conv, rows, grad, bn, spec, top, chol, sol)
}
"""),
    "infer_layouts": ("inferred results take the layout XLA gives them: the operand's (unary, first operand of "
                      "binary, predicate of select), permuted (transpose), or the default (pad, concatenate, reduce)", """
HloModule m

sum {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  ROOT z = add(x, y)
}

ENTRY e {
  p = f32[2,3]{0,1} parameter(0)
  q = f32[2,3]{1,0} parameter(1)
  s = f32[] parameter(2)
  b = pred[2,3]{0,1} parameter(3)
  neg = negate(p)
  mixed = add(q, p)
  isf = is-finite(p)
  pick = select(b, q, p)
  lt = compare(p, q), direction=LT
  padded = pad(p, s), padding=1_0x0_1
  joined = concatenate(p, p), dimensions={0}
  flipped = transpose(p), dimensions={1,0}
  summed = reduce(p, s), dimensions={1}, to_apply=sum
  ROOT t = tuple(neg, mixed, isf, pick, lt, padded, joined, flipped, summed)
}
"""),
    "typed_inline_operands": ("anonymous operands nested inline with their shapes, mixed with named ones", """
HloModule m

ENTRY e {
  first = add(f32[6] parameter(0), multiply(f32[6] parameter(1), f32[6] parameter(2)))
  ROOT r = tuple(first, negate(first), f32[6] exponential(first))
}
"""),
    "header_colon": ("`HloModule name:` as older dumps write it", """
HloModule old_dump:

ENTRY e {
  p = f32[2] parameter(0)
  ROOT n = f32[2] negate(p)
}
"""),
    "async_sugar_custom_call": ("custom-call-start/-update/-done without the wrapped computation, on a thread", """
HloModule m

ENTRY e {
  p = f32[16] parameter(0)
  s = ((f32[16]), f32[8], s32[]) custom-call-start(p), custom_call_target="halve", async_execution_thread="side"
  u = ((f32[16]), f32[8], s32[]) custom-call-update(s)
  ROOT d = f32[8] custom-call-done(u)
}
"""),
    "async_sugar_elementwise": ("op-start/op-done sugar for any op, with the wrapped op's own attributes", """
HloModule m

ENTRY e {
  a = f32[5] parameter(0)
  b = f32[5] parameter(1)
  s = ((f32[5], f32[5]), pred[5], s32[]) compare-start(a, b), direction=GE
  ROOT d = pred[5] compare-done(s)
}
"""),
    "constant_spellings": ("literal spellings XLA reads: stray commas, `1.`, -nan, NaN payloads that fit, u64 -1, "
                           "pred from integers, empty and elided arrays", """
HloModule m

ENTRY e {
  a = f32[3] constant({1., -nan, nan(0x1f)})
  b = f32[2] constant({1,2,})
  c = u64[] constant(-1)
  d = pred[2] constant({0, 2})
  f = bf16[2] constant({-nan(0x3f), 3.38e38})
  g = f32[0,2] constant({})
  h = s4[2] constant({-8, 7})
  i = c64[2] constant({(1, -2), (inf, nan)})
  ROOT t = (f32[3], f32[2], u64[], pred[2], bf16[2], f32[0,2], s4[2], c64[2]) tuple(a, b, c, d, f, g, h, i)
}
"""),
    "custom_call_scalar_literal": ("a custom-call's scalar literal, a number after the shape (both engines)", """
HloModule m

ENTRY e {
  a = f32[8] parameter(0)
  c = f32[8] custom-call(a), custom_call_target="tgt", literal=s32[] 3
  ROOT d = f32[8] custom-call(c), custom_call_target="tgt", literal=f32[] -inf
}
"""),
    "instruction_over_two_lines": ("an attribute list continued after a trailing comma", """
HloModule m

ENTRY e {
  a = f32[8] parameter(0)
  ROOT c = f32[8] custom-call(a), custom_call_target="tgt",
      backend_config="x"
}
"""),
    "single_device_and_unreduced_shardings": ("Shardy's callback sharding and unreduced axes (named and V2)", """
HloModule m, num_partitions=8

ENTRY e {
  a = f32[8,4] parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dims={unreduced}}
  b = f32[8,4] negate(a), sharding={mesh['x'=2,'y'=4], [{'y'}, {}], unreduced={'x'}}
  c = f32[8,4] custom-call(b), custom_call_target="cb", sharding={single_device[device_id=0]}
  ROOT t = (f32[8,4], f32[8,4]) tuple(b, c), sharding={{single_device[device_id=1]}, {replicated}}
}
"""),
    "strings_with_raw_line_breaks": ("a raw LF and a raw CR inside strings (XLA keeps them; a CR outside is a line end)", """
HloModule m

ENTRY e {
  a = f32[4] parameter(0), metadata={op_name="first
second"}
  ROOT n = f32[4] negate(a), metadata={op_name="x\ry" source_file="f\r.py"}\r
}
"""),
    "string_escapes": ("the escapes XLA's lexer takes (absl::CUnescape): \\x and \\X with any number of hex digits, octal, \\u, \\U", r"""
HloModule m

ENTRY e {
  a = f32[4] parameter(0), metadata={op_name="\x41z\X42\x0043\101\1011\0000" op_type="\u0041\U00000042\?\'\a\v"}
  ROOT n = f32[4] negate(a), metadata={op_name="\x4|\xFf|\7"}
}
"""),
    "iota_identity_transpose": ("`<=[2,2]T(0,1)` (a transpose that keeps the order) in a sharding and in replica groups", ADD + """
ENTRY e {
  a = f32[8,4] parameter(0), sharding={devices=[2,2]<=[2,2]T(0,1)}
  ROOT r = f32[8,4] all-reduce(a), replica_groups=[2,2]<=[2,2]T(0,1), to_apply=add
}
"""),
    "spaces_inside_values": ("spaces inside attribute values, but none between a name and its '='", """
HloModule m

ENTRY e {
  a = f32[8,4] parameter(0), sharding={devices=[ 2 , 2 ] 0 , 1 , 2 , 3 }, frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["x"=2]>}}
  b = f32[8,4] negate(a), sharding={mesh['x' = 2,'y'=2], [{'x'}, {}]}, metadata= {op_name="x =y"}
  ROOT c = f32[8,4] custom-call(b), custom_call_target="tgt", backend_config={is_stable = true, order = "TOTAL"}
}
"""),
    "last_tile_dims_as_many_as_tile_dims": ("as many subgroup dimensions as tile dimensions", """
HloModule m

ENTRY e {
  a = f32[8,4] parameter(0)
  ROOT n = f32[8,4] negate(a), sharding={devices=[2,2]<=[4] last_tile_dims={manual, replicated}}
}
"""),
}
CASES.update(INFERENCE_CASES)
