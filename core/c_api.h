/* The C API of the horovod_compat core: the one boundary the Python module, the TensorFlow op
 * library and the benchmarks use. Plain C, codes not exceptions.
 *
 * Conventions
 * - Functions returning int return HVDC_OK (0) or an hvdc_status_code; on failure
 *   hvdc_last_error() (thread-local) holds a message. Topology queries return -1 when the runtime
 *   is not initialized.
 * - hvdc_enqueue() either returns an error (the callback is then NOT called) or returns HVDC_OK,
 *   after which `done` is called exactly once, from a runtime thread (never the caller's), with the
 *   operation's own code and message -- also when the runtime shuts down first. Exception: requests
 *   flagged HVDC_REQUEST_MAY_COMPLETE_INLINE (see hvdc_request.flags).
 * - Inputs (and caller-provided outputs) stay valid until `done` runs.
 */
#ifndef HVDC_CORE_C_API_H_
#define HVDC_CORE_C_API_H_

#include <stdint.h>

#if defined(__GNUC__)
#define HVDC_EXPORT __attribute__((visibility("default")))
#else
#define HVDC_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes (= hvdc::StatusCode). Python maps them to Horovod's exception classes. */
enum hvdc_status_code {
  HVDC_OK = 0,
  HVDC_UNKNOWN_ERROR = 1,      /* also: the runtime has shut down */
  HVDC_PRECONDITION_ERROR = 2, /* cross-rank mismatch; not initialized */
  HVDC_ABORTED = 3,
  HVDC_INVALID_ARGUMENT = 4,
  HVDC_IN_PROGRESS = 5,
  HVDC_PEER_LOST = 6 /* a peer rank died, hung or was cut off (HorovodInternalError) */
};

/* Data types (= hvdc::DataType; Horovod's numbering plus bfloat16). */
enum hvdc_dtype {
  HVDC_UINT8 = 0,
  HVDC_INT8 = 1,
  HVDC_UINT16 = 2,
  HVDC_INT16 = 3,
  HVDC_INT32 = 4,
  HVDC_INT64 = 5,
  HVDC_FLOAT16 = 6,
  HVDC_FLOAT32 = 7,
  HVDC_FLOAT64 = 8,
  HVDC_BOOL = 9,
  HVDC_BFLOAT16 = 10
};

/* Reduce operations (= Horovod's values). */
enum hvdc_reduce_op {
  HVDC_AVERAGE = 0,
  HVDC_SUM = 1,
  HVDC_ADASUM = 2,
  HVDC_MIN = 3,
  HVDC_MAX = 4,
  HVDC_PRODUCT = 5
};

/* Collective kinds (= hvdc::OpType). */
enum hvdc_op {
  HVDC_OP_ALLREDUCE = 0,
  HVDC_OP_ALLGATHER = 1,
  HVDC_OP_BROADCAST = 2,
  HVDC_OP_ALLTOALL = 3,
  HVDC_OP_REDUCESCATTER = 4,
  HVDC_OP_BARRIER = 5,
  HVDC_OP_JOIN = 6
};

/* Process-set error codes (Horovod's HOROVOD_PROCESS_SET_ERROR_*). */
enum hvdc_process_set_error {
  HVDC_PROCESS_SET_ERROR_INIT = -1,
  HVDC_PROCESS_SET_ERROR_DYNAMIC = -2,
  HVDC_PROCESS_SET_ERROR_UNKNOWN_SET = -3,
  HVDC_PROCESS_SET_ERROR_FOREIGN_SET = -4,
  HVDC_PROCESS_SET_ERROR_SHUTDOWN = -5,
  HVDC_PROCESS_SET_ERROR_EXISTING_SET = -6
};

#define HVDC_MAX_DIMS 32

/* A tensor view. device: -1 = host memory, >= 0 = CUDA device ordinal. */
typedef struct hvdc_tensor {
  int32_t dtype;
  int32_t ndim;
  int64_t dims[HVDC_MAX_DIMS];
  int32_t device;
  void* data;
} hvdc_tensor;

typedef void (*hvdc_done_fn)(void* user, int code, const char* message);
/* Called once an output's shape is known (allgather, alltoall, reducescatter), on a runtime
 * thread; returns the output buffer (NULL = allocation failed, the op fails). */
typedef void* (*hvdc_alloc_fn)(void* user, int32_t ndim, const int64_t* dims);

/* One collective request. Zero-initialise it, then set what the op uses. */
typedef struct hvdc_request {
  int32_t op;             /* hvdc_op */
  const char* name;       /* matches the tensor across ranks; unique among in-flight tensors */
  int32_t process_set_id; /* 0 = global set */
  hvdc_tensor input;      /* barrier and join have none */
  /* allreduce, broadcast: caller-allocated output of the input's shape and dtype;
   * output.data == input.data means in place. Others: filled through `allocate`. */
  hvdc_tensor output;
  int32_t reduce_op;       /* allreduce, reducescatter */
  double prescale_factor;  /* 0 is read as 1 */
  double postscale_factor; /* 0 is read as 1 */
  int32_t root_rank;       /* broadcast: a global rank */
  const int32_t* splits;   /* alltoall: rows sent to each set rank; NULL = split dim 0 evenly */
  int32_t num_splits;
  int32_t* received_splits; /* alltoall: set-size entries, filled before done */
  hvdc_alloc_fn allocate;   /* allgather, alltoall, reducescatter */
  void* allocate_user;
  int32_t* join_last_rank; /* join: receives the last rank that joined */
  /* CUDA tensors (input.device >= 0) only; NULL = unused. Both stay valid until `done` runs.
   * ready_event: a cudaEvent_t recorded on the producer's stream once the input is written. The
   *   backend's stream waits for it (cudaStreamWaitEvent) before reading the input, so the caller
   *   need not synchronise with the GPU before hvdc_enqueue.
   * done_stream: a cudaStream_t of the consumer. As soon as the op's GPU work is queued, the
   *   backend makes done_stream wait for it (cudaStreamWaitEvent on the backend's event) and runs
   *   `done` then, without waiting for the GPU: work queued on done_stream after `done` sees the
   *   outputs, and may reuse the inputs (stream-ordered frees included); other streams and the
   *   host must synchronise with done_stream first. An error that the GPU reports after `done`
   *   (NCCL's asynchronous errors) fails the set's later operations instead. Without done_stream,
   *   `done` runs once the GPU has finished the work. */
  const void* ready_event;
  void* done_stream;
  uint32_t flags; /* hvdc_request_flags, or-ed */
} hvdc_request;

enum hvdc_request_flags {
  /* The caller allows `allocate` and `done` to run on its own thread, before hvdc_enqueue returns
   * (it holds no lock they take). The runtime does so for a process set of one member, whose
   * collectives need no negotiation and no peer: they run at once on the calling thread. Only
   * when every request of the call carries the flag. */
  HVDC_REQUEST_MAY_COMPLETE_INLINE = 1
};

/* Initialisation. Everything NULL/0 = all of MPI_COMM_WORLD under a launcher, or rank 0 of 1
 * without one (no MPI_Init at all). */
typedef struct hvdc_init_options {
  const int32_t* ranks; /* a subset of world ranks to run on, or NULL */
  int32_t num_ranks;
  void* mpi_comm; /* pointer to a borrowed MPI_Comm (duplicated), or NULL */
  /* Extra process sets registered at init: num_process_sets lists laid end to end in
   * process_set_ranks, with their lengths in process_set_sizes. */
  const int32_t* process_set_ranks;
  const int32_t* process_set_sizes;
  int32_t num_process_sets;
} hvdc_init_options;

HVDC_EXPORT int hvdc_init(const hvdc_init_options* options);
HVDC_EXPORT int hvdc_shutdown(void);
HVDC_EXPORT int hvdc_is_initialized(void);
HVDC_EXPORT const char* hvdc_last_error(void);

HVDC_EXPORT int hvdc_rank(void);
HVDC_EXPORT int hvdc_size(void);
HVDC_EXPORT int hvdc_local_rank(void);
HVDC_EXPORT int hvdc_local_size(void);
HVDC_EXPORT int hvdc_cross_rank(void);
HVDC_EXPORT int hvdc_cross_size(void);
HVDC_EXPORT int hvdc_is_homogeneous(void);        /* -1 when not initialized */
HVDC_EXPORT int hvdc_mpi_threads_supported(void); /* -1 when not initialized or MPI unused */
HVDC_EXPORT int hvdc_mpi_enabled(void);
HVDC_EXPORT int hvdc_mpi_built(void);
HVDC_EXPORT int hvdc_gloo_enabled(void); /* 1 when running over the TCP transport */
HVDC_EXPORT int hvdc_gloo_built(void);
HVDC_EXPORT int hvdc_nccl_built(void); /* NCCL_VERSION_CODE, or 0 */
HVDC_EXPORT int hvdc_cuda_built(void);
HVDC_EXPORT const char* hvdc_version(void);

/* Process sets. Ids are equal on all ranks. add/remove are collective over the world (every rank
 * calls them in the same order) and need HOROVOD_DYNAMIC_PROCESS_SETS=1. */
HVDC_EXPORT int hvdc_add_process_set(const int32_t* ranks, int32_t num_ranks); /* id or < 0 */
HVDC_EXPORT int hvdc_remove_process_set(int32_t id);                           /* 0 or < 0 */
HVDC_EXPORT int hvdc_process_set_rank(int32_t id);     /* rank within the set, or < 0 */
HVDC_EXPORT int hvdc_process_set_size(int32_t id);     /* or < 0 */
HVDC_EXPORT int hvdc_process_set_included(int32_t id); /* 1, 0, or < 0 */
HVDC_EXPORT int hvdc_number_of_process_sets(void);
HVDC_EXPORT int hvdc_process_set_ids(int32_t* ids_out, int32_t capacity); /* count, or < 0 */
HVDC_EXPORT int hvdc_process_set_ranks(int32_t id, int32_t* ranks_out, int32_t capacity);

/* Collectives. count > 1 enqueues a group: its members are negotiated and fused together and
 * `done` runs once, after the last member, with the first error. */
HVDC_EXPORT int hvdc_enqueue(const hvdc_request* requests, int32_t count, hvdc_done_fn done,
                             void* user);

/* Timeline (needs HOROVOD_TIMELINE set at init; "DYNAMIC" enables it without a file). */
HVDC_EXPORT int hvdc_start_timeline(const char* path, int mark_cycles);
HVDC_EXPORT int hvdc_stop_timeline(void);

#ifdef __cplusplus
}
#endif

#endif /* HVDC_CORE_C_API_H_ */
