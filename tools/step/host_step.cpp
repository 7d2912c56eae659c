#include "step/host_step.h"

#include "thdcp/cpu/attention.h"

namespace thdcp::tools {

size_t StepShape::bytes(int64_t rows, int64_t heads, int64_t dim) const {
  return checked_tensor_bytes(rows, heads, dim != 0 ? dim : head_dim, dtype);
}

AttentionProblem attention_problem(const StepShape& shape, const Capacity& capacity, const Mask& mask) {
  return AttentionProblem{shape.heads(), capacity, mask, shape.dtype, shape.dtype, shape.dtype};
}

cp::Problem cp_problem(const StepShape& shape, int cp, const Capacity& capacity, const Mask& mask, CpLayout layout,
                       cp::CpComm comm, cp::KvGather kv_gather, int a2a_size, DType reduce_dtype) {
  return cp::Problem{shape.heads(), cp, capacity, mask, shape.dtype, layout, comm, kv_gather, a2a_size, reduce_dtype};
}

BatchLayout exact_layout(const std::vector<int64_t>& lengths, int cp) {
  return make_layout(lengths, cp, Capacity{static_cast<int>(lengths.size()) + 1, make_layout(lengths, cp).total_rows()});
}

HostInputs host_inputs(const StepShape& shape, int64_t rows) {
  return HostInputs{HostTensor(shape.dtype, rows, shape.q_heads, shape.head_dim),
                    HostTensor(shape.dtype, rows, shape.kv_heads, shape.head_dim),
                    HostTensor(shape.dtype, rows, shape.kv_heads, shape.value_head_dim()),
                    HostTensor(shape.dtype, rows, shape.q_heads, shape.value_head_dim())};
}

HostOutputs host_outputs(const StepShape& shape, int64_t rows) {
  HostOutputs outputs;
  outputs.out = HostTensor(shape.dtype, rows, shape.q_heads, shape.value_head_dim());
  outputs.dq = HostTensor(shape.dtype, rows, shape.q_heads, shape.head_dim);
  outputs.dk = HostTensor(shape.dtype, rows, shape.kv_heads, shape.head_dim);
  outputs.dv = HostTensor(shape.dtype, rows, shape.kv_heads, shape.value_head_dim());
  outputs.lse.assign(static_cast<size_t>(rows * shape.q_heads), 0.0f);
  outputs.max_logit.assign(static_cast<size_t>(shape.q_heads), 0.0f);
  return outputs;
}

HostOutputs cpu_reference(const SegmentTable& table, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                          const HostTensor& dout) {
  HostOutputs ref = host_outputs(StepShape{{q.heads(), k.heads(), q.head_dim(), v.head_dim()}, q.dtype()}, q.tokens());
  cpu::attention_forward(table, q.view(), k.view(), v.view(), ref.out.view(), ref.lse.data(), ref.max_logit.data());
  cpu::attention_backward(table, q.view(), k.view(), v.view(), ref.out.view(), dout.view(), ref.lse.data(),
                          ref.dq.view(), ref.dk.view(), ref.dv.view());
  return ref;
}

}  // namespace thdcp::tools
