// Op definitions: the names, attributes, dtypes and shape functions of Horovod 0.28.1's TensorFlow
// ops (so graphs and SavedModels name the same ops), plus bfloat16 for allreduce, allgather,
// broadcast and reducescatter.
//
// Unlike Horovod's, the collectives are marked stateful: otherwise grappler constant-folds a
// collective whose input is constant (running it once at optimisation time and baking the result
// into the graph) and merges identical collectives (CSE). The Python layer registers them as
// order-insensitive for tf.function's automatic control dependencies, so they still run
// concurrently and fuse.
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace hvdc_tf {
namespace {

using Status = absl::Status;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

#define HVDC_ALLREDUCE_TYPES "{uint8, int8, int32, int64, float16, float32, float64, bfloat16}"
#define HVDC_GATHER_TYPES \
  "{uint8, int8, uint16, int16, int32, int64, float16, float32, float64, bool, bfloat16}"
#define HVDC_ALLTOALL_TYPES \
  "{uint8, int8, uint16, int16, int32, int64, float16, float32, float64, bool}"
#define HVDC_INPLACE_TYPES "{uint8, int8, int32, int64, float16, float32, float64, bool}"
#define HVDC_REDUCESCATTER_TYPES "{int32, int64, float16, float32, float64, bfloat16}"

// Every output has its input's shape.
Status SameShapes(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
  return Status();
}

// Output i = input i with an unknown first dimension (rank >= 1 required).
Status UnknownFirstDim(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) {
    ShapeHandle output;
    TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(i), 1, &output));
    TF_RETURN_IF_ERROR(c->ReplaceDim(output, 0, c->UnknownDim(), &output));
    c->set_output(i, output);
  }
  return Status();
}

Status ScalarOutput(InferenceContext* c) {
  c->set_output(0, c->Scalar());
  return Status();
}

}  // namespace

REGISTER_OP("HorovodAllreduce")
    .Attr("T: " HVDC_ALLREDUCE_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float")
    .Attr("postscale_factor: float")
    .Attr("ignore_name_scope: bool = False")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("sum: T")
    .SetIsStateful()
    .SetShapeFn(SameShapes)
    .Doc("Reduces `tensor` across the ranks of a process set (sum, average, min, max, product).");

REGISTER_OP("HorovodGroupedAllreduce")
    .Attr("T: " HVDC_ALLREDUCE_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float")
    .Attr("postscale_factor: float")
    .Attr("num_tensors: int >= 1")
    .Attr("ignore_name_scope: bool = False")
    .Attr("process_set_id: int = 0")
    .Input("tensors: num_tensors*T")
    .Output("sum: num_tensors*T")
    .SetIsStateful()
    .SetShapeFn(SameShapes)
    .Doc("Allreduce of several tensors negotiated and fused as one group.");

REGISTER_OP("HorovodAllgather")
    .Attr("T: " HVDC_GATHER_TYPES)
    .Attr("ignore_name_scope: bool = False")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(UnknownFirstDim)
    .Doc("Concatenates `tensor` from every rank of the set along the first dimension.");

REGISTER_OP("HorovodGroupedAllgather")
    .Attr("T: " HVDC_GATHER_TYPES)
    .Attr("num_tensors: int >= 1")
    .Attr("ignore_name_scope: bool = False")
    .Attr("process_set_id: int = 0")
    .Input("tensors: num_tensors*T")
    .Output("output: num_tensors*T")
    .SetIsStateful()
    .SetShapeFn(UnknownFirstDim)
    .Doc("Allgather of several tensors negotiated as one group.");

REGISTER_OP("HorovodBroadcast")
    .Attr("T: " HVDC_GATHER_TYPES)
    .Attr("root_rank: int")
    .Attr("ignore_name_scope: bool = False")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(SameShapes)
    .Doc("Returns root_rank's value of `tensor` on every rank of the set.");

REGISTER_OP("HorovodBroadcastInplace")
    .Attr("T: " HVDC_INPLACE_TYPES)
    .Attr("root_rank: int")
    .Attr("process_set_id: int = 0")
    .Attr("num_variables: int")
    .Attr("variable_names: list(string)")
    .Input("tensor_refs: Ref(num_variables*T)")
    .Output("output_refs: Ref(num_variables*T)")
    .SetIsStateful()
    .SetShapeFn(SameShapes)
    .Doc("Overwrites reference variables with root_rank's values.");

REGISTER_OP("HorovodBroadcastInplaceResource")
    .Attr("root_rank: int")
    .Attr("process_set_id: int = 0")
    .Attr("num_variables: int")
    .Attr("variable_names: list(string)")
    .Input("resources: num_variables*resource")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Overwrites resource variables with root_rank's values.");

REGISTER_OP("HorovodAlltoall")
    .Attr("T: " HVDC_ALLTOALL_TYPES)
    .Attr("ignore_name_scope: bool = False")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Input("splits: int32")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> Status {
      ShapeHandle output;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &output));
      TF_RETURN_IF_ERROR(c->ReplaceDim(output, 0, c->UnknownDim(), &output));
      c->set_output(0, output);
      ShapeHandle splits;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &splits));
      // Without splits (an empty tensor) the runtime still reports one count per set rank.
      auto dim = c->Dim(splits, 0);
      if (c->ValueKnown(dim) && c->Value(dim) == 0) {
        c->set_output(1, c->Vector(c->UnknownDim()));
      } else {
        c->set_output(1, splits);
      }
      return Status();
    })
    .Doc("Sends splits[i] rows of `tensor` to set rank i and concatenates what arrives.");

REGISTER_OP("HorovodReducescatter")
    .Attr("T: " HVDC_REDUCESCATTER_TYPES)
    .Attr("reduce_op: int")
    .Attr("ignore_name_scope: bool = False")
    .Attr("prescale_factor: float")
    .Attr("postscale_factor: float")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetIsStateful()
    .SetShapeFn(UnknownFirstDim)
    .Doc("Reduces `tensor` across the set; each rank keeps its slice of the first dimension.");

REGISTER_OP("HorovodGroupedReducescatter")
    .Attr("T: " HVDC_REDUCESCATTER_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float")
    .Attr("postscale_factor: float")
    .Attr("num_tensors: int >= 1")
    .Attr("ignore_name_scope: bool = False")
    .Attr("process_set_id: int = 0")
    .Input("tensors: num_tensors*T")
    .Output("output: num_tensors*T")
    .SetIsStateful()
    .SetShapeFn(UnknownFirstDim)
    .Doc("Reducescatter of several tensors negotiated as one group.");

REGISTER_OP("HorovodJoin")
    .Output("output: int32")
    .SetIsStateful()
    .SetShapeFn(ScalarOutput)
    .Doc("Marks this rank as out of data; returns the last rank that joined.");

REGISTER_OP("HorovodSize")
    .Attr("process_set_id: int = 0")
    .Output("size: int32")
    .SetIsStateful()
    .SetShapeFn(ScalarOutput)
    .Doc("Number of ranks in the process set, read when the op runs.");

REGISTER_OP("HorovodProcessSetIncluded")
    .Attr("process_set_id: int = 0")
    .Output("included: int32")
    .SetIsStateful()
    .SetShapeFn(ScalarOutput)
    .Doc("1 if this rank belongs to the process set, 0 if not, a negative error code otherwise.");

REGISTER_OP("HorovodLocalSize")
    .Output("local_size: int32")
    .SetIsStateful()
    .SetShapeFn(ScalarOutput)
    .Doc("Number of ranks on this node, read when the op runs.");

REGISTER_OP("HorovodRank")
    .Output("rank: int32")
    .SetIsStateful()
    .SetShapeFn(ScalarOutput)
    .Doc("This process's global rank, read when the op runs.");

REGISTER_OP("HorovodLocalRank")
    .Output("local_rank: int32")
    .SetIsStateful()
    .SetShapeFn(ScalarOutput)
    .Doc("This process's rank on its node, read when the op runs.");

}  // namespace hvdc_tf
