// Config: every HOROVOD_* variable the core honours, parsed and validated once (Config::FromEnv).
// Each field: its variable, default, and meaning. Invalid values fail init() with a message naming
// the variable and the value (a deliberate difference from Horovod, which parses garbage as 0).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace hvdc {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };

struct Config {
  // HOROVOD_FUSION_THRESHOLD: fusion buffer bytes; 0 disables fusion.
  int64_t fusion_threshold_bytes = 128LL * 1024 * 1024;
  // HOROVOD_CYCLE_TIME (ms, float): the longest wait for stragglers while a batch executes.
  // Defaults to 0 when HOROVOD_ENABLE_XLA_OPS=1 (as in Horovod; that is all that variable does
  // here).
  double cycle_time_ms = 1.0;
  // HOROVOD_CACHE_CAPACITY: response-cache entries; 0 disables the cache.
  int64_t cache_capacity = 1024;
  // HOROVOD_TIMELINE: Chrome-trace path written by the coordinator; "DYNAMIC" = enabled, no file.
  std::string timeline_path;
  // HOROVOD_TIMELINE_MARK_CYCLES: mark negotiation cycles in the timeline.
  bool timeline_mark_cycles = false;
  // HOROVOD_STALL_CHECK_DISABLE: turn the stall inspector off.
  bool stall_check_disable = false;
  // HOROVOD_STALL_CHECK_TIME_SECONDS: warn about tensors some ranks have not submitted after this.
  double stall_check_time_s = 60.0;
  // HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: fail everything and shut down after this (0 = never).
  double stall_shutdown_time_s = 0.0;
  // HOROVOD_PEER_LOSS_EXIT_SECONDS: when the transport reports a lost peer rank, every pending and
  // later operation fails at once; this many seconds later the process exits with status 1 (so a
  // rank idle or stuck outside horovod_compat ends too). 0 = never exit, only fail operations.
  double peer_loss_exit_s = 3.0;
  // HOROVOD_ELASTIC: an elastic job (horovodrun's elastic mode): a lost peer fails every pending
  // and later operation (HorovodInternalError in Python) but arms no exit timer
  // (HOROVOD_PEER_LOSS_EXIT_SECONDS is for static jobs), and a peer that shuts down while this
  // rank still runs fails this rank's operations the same way, naming it; the worker then
  // re-initialises (shutdown() and init() in the same process).
  bool elastic = false;
  // HOROVOD_PEER_TIMEOUT_SECONDS: TCP transport: a peer from which nothing (data or heartbeat)
  // arrives for this long is lost -- stopped, hung or cut off (0 = no heartbeats).
  double peer_timeout_s = 4.0;
  // HOROVOD_MPI_THREADS_DISABLE: request MPI_THREAD_SERIALIZED; control and execution share a
  // thread.
  bool mpi_threads_disable = false;
  // HOROVOD_MPI_LIVENESS: under MPI, a heartbeat-only TCP mesh beside MPI notices a dead or hung
  // rank (which MPI cannot report) and fails the job as the TCP transport does (0 = off).
  bool mpi_liveness = true;
  // HOROVOD_LOG_LEVEL: trace, debug, info, warning, error, fatal (case-insensitive).
  LogLevel log_level = LogLevel::kWarning;
  // HOROVOD_LOG_HIDE_TIME: drop timestamps from log lines.
  bool log_hide_time = false;
  // HOROVOD_CONTROLLER, HOROVOD_CPU_OPERATIONS: "mpi" or "gloo" (the TCP transport; ccl comes
  // later). Either set to gloo selects the TCP transport (HOROVOD_CPU_OPERATIONS only outside an
  // mpirun job).
  std::string controller = "mpi";
  std::string cpu_operations = "mpi";
  // HOROVOD_DYNAMIC_PROCESS_SETS: allow add/remove_process_set after init.
  bool dynamic_process_sets = false;
  // HOROVOD_DISABLE_GROUP_FUSION: grouped tensors are not fused with other tensors.
  bool disable_group_fusion = false;
  // HOROVOD_THREAD_AFFINITY: comma-separated core ids, one per local rank (control thread).
  std::vector<int> thread_affinity;
  // HOROVOD_GLOO_IFACE: the TCP transport listens on this interface's address.
  // HOROVOD_GLOO_TIMEOUT_SECONDS: how long the TCP transport's rendezvous waits for every rank.
  std::string gloo_iface;
  int gloo_timeout_s = 30;
  // The TCP ("gloo") transport's identity, as horovodrun --gloo sets it (or by hand); -1 or empty
  // when unset: HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE,
  // HOROVOD_CROSS_RANK, HOROVOD_CROSS_SIZE, HOROVOD_HOSTNAME, HOROVOD_GLOO_RENDEZVOUS_ADDR,
  // HOROVOD_GLOO_RENDEZVOUS_PORT (1..65535). tcp_controller/tcp_transport.h checks them together.
  struct GlooIdentity {
    int rank = -1;
    int size = -1;
    int local_rank = -1;
    int local_size = -1;
    int cross_rank = -1;
    int cross_size = -1;
    std::string hostname;
    std::string rendezvous_addr;
    int rendezvous_port = -1;
  } gloo;
  // HVDC_TCP_PEERS: "host:port,host:port,..." of every rank (index = rank), the static alternative
  // to a rendezvous service (what the Python shim writes from TF_CONFIG).
  std::string tcp_peers;
  // HOROVOD_SECRET_KEY: the job's shared secret (horovodrun --gloo makes one per job; TF_CONFIG
  // jobs may set one by hand). Every TCP connection and rendezvous request proves it. Never
  // printed (Describe() says only whether it is set).
  std::string secret_key;
  // HVDC_TCP_BIND_ADDRESS: the address the TCP transport listens on when HOROVOD_GLOO_IFACE is
  // not set ("0.0.0.0" or "::" = every interface); empty = chosen as docs/tcp.md says.
  std::string tcp_bind_address;
  // HVDC_TCP_ADDRESS_ORIGIN: what set the addresses above, named in start-up errors instead of
  // variables the user never saw: "TF_CONFIG" (the shim's translation of a TF_CONFIG cluster),
  // "horovodrun --gloo" (our launcher); empty = the variables were set by hand.
  std::string tcp_address_origin;
  // HVDC_TCP_RENDEZVOUS_SCOPE: the rendezvous service's store scope under which the TCP
  // transport's ranks publish their listening addresses (/<scope>/rank_<r>). An elastic worker
  // gets a fresh one per round ("elastic-<round>") so a new world never reads an old world's
  // addresses. 1..128 characters from [A-Za-z0-9._-] (one URL path segment).
  std::string tcp_rendezvous_scope = "global";

  // Ours (no Horovod equivalent):
  // HVDC_CHUNK_BYTES: long CPU reductions are issued in chunks of this many bytes (cache-sized).
  int64_t chunk_bytes = 4LL * 1024 * 1024;
  // HVDC_ZERO_COPY_BYTES: an allreduce tensor at least this large is reduced from its own memory
  // instead of being copied through the fusion buffer. On the 2-core VM one MPI_Allreduce of
  // 256 KiB costs about what copying it into and out of the buffer does (bench B0).
  int64_t zero_copy_bytes = 256LL * 1024;
  // HVDC_SHM: ranks of a process set that share a host move data through shared memory
  // (shm_controller/, docs/shm.md); 0 keeps the transport's own data plane.
  bool shm_enabled = true;
  // HVDC_SHM_CONTROL: such a set also negotiates through shared memory (not MPI or sockets).
  bool shm_control = true;
  // HVDC_SHM_BYTES: the size of each such set's shared-memory segment; a larger call is carried
  // in rounds. Too small for the set's ranks, or more than /dev/shm holds: logged, not used.
  // 0 (the default): chosen per set (shm::DefaultSegmentBytes), from measurements.
  int64_t shm_bytes = 0;
  // HOROVOD_HIERARCHICAL_ALLREDUCE, HOROVOD_HIERARCHICAL_ALLGATHER (horovodrun
  // --hierarchical-allreduce / --hierarchical-allgather): a process set spanning hosts, with the
  // same number of its ranks on each, runs allreduce / allgather in three steps -- within each
  // host (shared memory), across hosts (one rank per host and block, all local ranks at once),
  // within each host again (shm_controller/hierarchical_host_comm.h, docs/shm.md). CPU tensors;
  // off by default: 1.5x the flat ring on a 1 Gbit/s link, no consistent gain on a fast one
  // (docs/shm.md has the figures).
  bool hierarchical_allreduce = false;
  bool hierarchical_allgather = false;

  // Not a setting: true when a launcher's identity variables are present (OMPI_COMM_WORLD_SIZE,
  // PMI_SIZE, PMIX_RANK or PMI_RANK, even if empty). The runtime then initializes MPI; otherwise it
  // runs as rank 0 of 1 over an in-process channel without calling MPI_Init.
  bool under_launcher = false;
  // Not a setting: true when OMPI_MCA_mpi_yield_when_idle is present (mpirun --mca
  // mpi_yield_when_idle N passes it so; even if empty). When it is not, the runtime's own
  // MPI_Init sets it to 1, so that Open MPI's blocking calls yield the core while they wait
  // (docs/waiting.md); the user's value, when given, is left alone.
  bool mpi_yield_when_idle_set = false;

  // Reads the variables through `getenv` (tests inject their own). Warnings for accepted but
  // ignored settings are appended to *warnings. On error *out and *warnings are left untouched and
  // the InvalidArgument message names the variable and its value.
  //
  // Value syntax (stricter than Horovod, which parses garbage as 0):
  //  - an unset or empty (all-whitespace) variable means "use the default"; surrounding
  //    whitespace is ignored (paths and interface names are taken verbatim);
  //  - integers: whole decimal numbers ("+" allowed, no exponent or fraction), range-checked;
  //  - numbers (times, noise): decimal or exponent notation, finite, >= 0 (check time > 0);
  //  - booleans: a non-negative integer (> 0 is true, as in Horovod), or true/false, yes/no,
  //    on/off (case-insensitive).
  using EnvLookup = std::function<std::optional<std::string>(const char*)>;
  static Status FromEnv(const EnvLookup& getenv, Config* out, std::vector<std::string>* warnings);
  static Status FromProcessEnv(Config* out, std::vector<std::string>* warnings);
  // One line per field ("HOROVOD_FUSION_THRESHOLD=134217728"), logged at debug.
  std::string Describe() const;
};

const char* LogLevelName(LogLevel level);  // "trace", ..., "fatal"

// Horovod settings this runtime accepts but does not act on (autotune, the GPU-path switches):
// Config has no field for them. Config::FromEnv still validates each one's value (a bad value fails
// init like any other), and each that is set, other than a switch set to false, is named in one
// warning: "<VAR>=<value> is accepted but has no effect here: <why>".
struct NoEffectSetting {
  const char* name;
  const char* why;
};
const std::vector<NoEffectSetting>& NoEffectSettings();

}  // namespace hvdc
