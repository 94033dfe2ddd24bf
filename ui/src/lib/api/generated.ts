// Generated from the Rust types by src/api/bindings.rs: do not edit. To write it again:
// SHOAL_WRITE_BINDINGS=1 cargo test --release --lib api::bindings

/**
 * A node's permanent identity (a UUID).
 */
export type NodeId = string;

export type PeerStatus = "connecting" | "alive" | "suspect" | "down";

/**
 * A member's status as this node sees it, in the cluster's snapshot: this node itself, or a peer's
 * [`PeerStatus`].
 */
export type NodeStatus = "self" | "connecting" | "alive" | "suspect" | "down";

export type Verdict = "pass" | "fail" | "unknown";

export type Check = { id: string, title: string, verdict: Verdict, reason: string, 
/**
 * What to do about a failure (empty when it passes).
 */
fix: string, };

/**
 * A Thunderbolt cable from this Mac to another, with what each layer says about it.
 */
export type ThunderboltLink = { receptacle: number | null, 
/**
 * This side's bus domain (the other Mac sees it as its peer's domain).
 */
domain_uuid: string | null, interface: string | null, speed_gbps: number | null, peer_name: string, peer_domain_uuid: string, peer_rdma_service: boolean, ipv4: Array<string>, rdma_device: string | null, port_state: string | null, 
/**
 * A link-local IPv4 to give the interface when it has none (what the IPv4 fix assigns).
 */
suggested_ipv4?: string | null, };

/**
 * `sw_vers`: product version and build.
 */
export type MacOsVersion = { version: string, build: string, };

/**
 * The doctor's findings for one node.
 */
export type RdmaNodeReport = { platform: string, macos: MacOsVersion | null, checks: Array<Check>, links: Array<ThunderboltLink>, 
/**
 * Links whose every layer is ready for RDMA (by interface).
 */
usable_interfaces: Array<string>, };

export type DeviceMemory = { total: number, free: number, };

/**
 * A node's compute device as its telemetry shows it.
 */
export type DeviceTelemetry = { 
/**
 * ggml's name for it: `CPU`, `Metal`, `CUDA0`, `Vulkan0`, …
 */
name: string, 
/**
 * `CPU`, `GPU`, `integrated GPU` or `accelerator`.
 */
kind: string, description: string, 
/**
 * Its own memory, when it has memory apart from the host's (a discrete GPU): weights, KV cache and
 * compute buffers must fit there, so it bounds what the node offers.
 */
own_memory: DeviceMemory | null, };

/**
 * One type's measured rate: bytes of weights per second with one thread and with every core, with
 * rows of [`LONG_ROW`] weights and of [`SHORT_ROW`] weights.
 */
export type WeightRate = { 
/**
 * ggml's name of the type measured (`q4_K`, `q8_0`, `f16`, …).
 */
dtype: string, one_thread: number, all_cores: number, 
/**
 * With short rows (0: not measured, as by an older member: every row is taken as long).
 */
short_one_thread: number, short_all_cores: number, };

export type NodeTelemetry = { memory_total: number, memory_available: number, 
/**
 * Resident memory of this node's shoal processes (the agent and its workers).
 */
memory_used_by_shoal: number, 
/**
 * What this node offers models: available memory less headroom for the OS and other apps, capped
 * by --memory-limit (less what shoal's workers already use) and, on macOS, by the GPU limit.
 */
memory_offer: number, 
/**
 * Measured memory read bandwidth in bytes/s (a decode step reads its weights once).
 */
memory_bandwidth: number | null, 
/**
 * Bytes of weights a decode step's products read per second on the CPU, for a 4-, an 8- and a
 * 16-bit type, with one thread and with every core (engine::weight_rate); placement predicts a
 * stage's step time from them.
 */
weight_rates: Array<WeightRate>, cpu_model: string, cpu_cores: number, cpu_threads: number, load_1m: number, os: string, os_version: string, kernel: string, arch: string, 
/**
 * Apple silicon chip (macOS), e.g. "Apple M3 Ultra".
 */
chip: string | null, 
/**
 * Memory the GPU may use (macOS unified memory): the `iogpu.wired_limit_mb` setting when set,
 * otherwise an estimate of macOS's default share.
 */
gpu_memory_limit: number | null, 
/**
 * Where `gpu_memory_limit` comes from: "sysctl iogpu.wired_limit_mb" or "macOS default (estimate)".
 */
gpu_memory_limit_source: string | null, 
/**
 * The RDMA doctor's latest report on this node (refreshed when its network interfaces change).
 */
rdma: RdmaNodeReport | null, 
/**
 * The device this node's stages compute on (`--device`, else the best there is).
 */
device: DeviceTelemetry | null, sampled_at_ms: number, };

export type NodeView = { id: NodeId, name: string, is_self: boolean, 
/**
 * `self` for this node, else the peer's status as this node sees it.
 */
status: NodeStatus, control: Array<string>, api_port: number, last_heard_ms_ago: number | null, telemetry: NodeTelemetry | null, };

export type LinkKind = "loopback" | "ethernet" | "wifi" | "thunderbolt" | "unknown";

/**
 * The transport a link uses, as the UI shows it (an RDMA or TCP badge with the reason).
 */
export type LinkTransport = { "kind": "rdma", device: string, } | { "kind": "tcp", reason: string, 
/**
 * When RDMA is tried again (after a failure), in ms since the epoch.
 */
retry_at_ms?: number | null, };

/**
 * One node's measurements of its link to a peer, as it reports them to the cluster.
 */
export type LinkReport = { peer: NodeId, kind: LinkKind, 
/**
 * The local interface carrying the link.
 */
interface: string | null, local_addr: string | null, remote_addr: string | null, rtt_p50_us: number | null, rtt_p99_us: number | null, rtt_samples: number, 
/**
 * Bits per second from the reporting node to the peer, from the last bulk transfer.
 */
throughput_bps: number | null, throughput_measured_at_ms: number | null, 
/**
 * The median round trip of small frames between two threads waiting for them, as a model's sums
 * and hops see it (the probe's echo; absent until a probe ran, or from older nodes).
 */
echo_rtt_us?: number, 
/**
 * Connections lost, refused dials and malformed input on this link since the node started.
 */
errors: number, 
/**
 * Probes of the link (throughput and echo) that failed since the node started; counted in `errors`
 * too. Tells a link whose probe failed (not waited for by launches) from one not probed yet.
 */
probe_failures: number, 
/**
 * The transport the ring uses on this link (an RDMA or TCP badge) and why; absent from older nodes.
 */
transport?: LinkTransport | null, };

export type LinkView = { a: NodeId, b: NodeId, kind: LinkKind, rtt_p50_us: number | null, rtt_p99_us: number | null, 
/**
 * The round trip of small frames between waiting threads, as a model's traffic sees it (from
 * either end's last probe; absent until one ran, or from older nodes).
 */
echo_rtt_us?: number, throughput_a_to_b_bps: number | null, throughput_b_to_a_bps: number | null, errors: number, 
/**
 * The reports the view was made from (a's, then b's).
 */
reports: Array<LinkReport>, };

export type PoolView = { 
/**
 * Members currently up (this node and alive or suspect peers).
 */
nodes_up: number, memory_total: number, memory_available: number, memory_used_by_shoal: number, 
/**
 * Sum of the GPU-usable limits of the nodes that report one (macOS).
 */
gpu_memory_limit: number, };

export type NearbyNodeView = { id: NodeId, name: string, control: Array<string>, api_port: number, };

export type NearbyCluster = { cluster_id: string, nodes: Array<NearbyNodeView>, };

export type ClusterSnapshot = { cluster_id: string, node_id: NodeId, nodes: Array<NodeView>, links: Array<LinkView>, pool: PoolView, nearby: Array<NearbyCluster>, 
/**
 * When the active join code expires (the code itself is shown only to whoever created it).
 */
join_code_expires_at_ms: number | null, };

export type JoinCode = { code: string, expires_at_ms: number, expires_in_seconds: number, 
/**
 * Whether this node advertises itself with mDNS (a new machine nearby then finds it by the code
 * alone; otherwise it needs `CODE@HOST:PORT`).
 */
mdns: boolean, 
/**
 * This node's control addresses, for `--join CODE@HOST:PORT` where multicast does not reach.
 */
join_addresses: Array<string>, };

export type JoinRequest = { 
/**
 * `ABCD-EFGH`, or `ABCD-EFGH@HOST:PORT` to join through a given member.
 */
code: string, };

export type InstanceState = "launching" | "ready" | "recovering" | "failed" | "stopped" | "replaced";

/**
 * Why an instance exists: it replaces another one that lost a node or a worker.
 */
export type Recovery = { 
/**
 * The instance this one replaces.
 */
replaces: string, 
/**
 * What happened to that one.
 */
reason: string, 
/**
 * 1 when the instance it replaces had served; one more for each replacement in a row that had not.
 */
attempt: number, };

/**
 * A worker's lifecycle, as the API shows it.
 */
export type WorkerState = "starting" | "fetching" | "loading" | "connecting" | "ready" | "serving" | "failed" | "stopped";

/**
 * Memory a stage needs, in bytes.
 */
export type StageBytes = { weights: number, kv_cache: number, compute: number, };

/**
 * Memory a stage uses, in bytes.
 */
export type StageMemory = { weights: number, kv_cache: number, compute: number, };

/**
 * A stage's counters since it started.
 */
export type StageStats = { steps: number, tokens: number, 
/**
 * Requests' rows summed over the steps: above `steps` when steps ran several requests at once.
 */
rows: number, compute_us_total: number, 
/**
 * Stage 0: requests served and generated tokens.
 */
requests: number, generated_tokens: number, 
/**
 * Stage 0: per decode step, the time on the ring's links divided by the hops (p50/p99, µs).
 */
hop_p50_us: number | null, hop_p99_us: number | null, active_requests: number, 
/**
 * A tensor-parallel leader: the median time of one sum across the group (two per layer).
 */
allreduce_p50_us: number | null, 
/**
 * Stage 0: requests waiting for a slot.
 */
queued_requests: number, 
/**
 * Stage 0: prompt tokens of the requests served, and those of them the prompt cache gave back
 * (a slot's or a saved prefix's rows) instead of prefilling: their ratio is its hit rate.
 */
prompt_tokens: number, cached_tokens: number, 
/**
 * Stage 0: saved prefixes written back into a slot, and the positions saved prefixes hold in
 * memory and on disk (every stage holds its layers' rows of each).
 */
restored_prefixes: number, saved_prefix_positions: number, saved_prefix_positions_on_disk: number, 
/**
 * Stage 0: tokens drafted for speculative decoding, and those of them the model kept (each kept
 * one is a step saved): their ratio is the acceptance rate.
 */
drafted_tokens: number, accepted_tokens: number, 
/**
 * Stage 0: what a drafted row costs, as a share of a decode step of one row, as it measured its
 * steps (none before steps of different sizes ran).
 */
draft_row_cost: number | null, };

/**
 * A stage's fetch of its share, as the instance shows it.
 */
export type StageFetch = { 
/**
 * The member the bytes come from (None: the hub).
 */
from_node: NodeId | null, 
/**
 * Its name, or the hub's address.
 */
from: string, bytes_done: number, 
/**
 * The header and the stage's tensors.
 */
bytes_total: number, 
/**
 * Bytes that came over the network (not those already here).
 */
bytes_fetched: number, bytes_per_second: number, done: boolean, };

/**
 * One rank's share of a model: for each part, the units it holds (heads, columns, experts, rows) of
 * how many there are.
 */
export type TensorSlice = { rank: number, ranks: number, 
/**
 * Query heads, by share.
 */
query_heads: { start: number, end: number, }, 
/**
 * The key/value heads its query heads read: a group whose query heads two ranks divide is held
 * by both.
 */
kv_heads: { start: number, end: number, }, 
/**
 * Columns of the dense feed-forward's inner width.
 */
feed_forward: { start: number, end: number, }, 
/**
 * Columns of the shared experts' inner width.
 */
shared_feed_forward: { start: number, end: number, }, 
/**
 * Routed experts.
 */
experts: { start: number, end: number, }, 
/**
 * Rows of the output head.
 */
vocabulary: { start: number, end: number, }, 
/**
 * How many units of each part the model has, in [`PARTS`] order.
 */
totals: [number, number, number, number, number, number], };

export type StageStatus = { node: NodeId, node_name: string, layers: { start: number, end: number, }, state: WorkerState, 
/**
 * Loading progress, 0..=1.
 */
progress: number, data_port: number | null, memory: StageMemory | null, stats: StageStats | null, error: string | null, 
/**
 * The fetch of this stage's share of the model, when its node lacked it.
 */
fetch: StageFetch | null, 
/**
 * The device the stage computes on (`CPU`, `Metal`, …), once it has loaded.
 */
device: string | null, 
/**
 * A tensor-parallel rank's slice of every layer: its heads, feed-forward columns, experts and
 * output rows.
 */
slice: TensorSlice | null, };

export type StagePlan = { node: NodeId, node_name: string, layers: { start: number, end: number, }, bytes: StageBytes, offer: number, 
/**
 * Expected decode time of this stage per token (memory-bound estimate), when the node's bandwidth is known.
 */
expected_step_us: number | null, 
/**
 * A tensor-parallel rank's slice of every layer (its `layers` are then the whole model).
 */
slice: TensorSlice | null, 
/**
 * A tensor-parallel rank's share, relative to the group's others (its part of each divided tensor is
 * its share over their sum): the rank's worker plans its slice from every rank's share.
 */
share?: number, 
/**
 * Which stage of the ring this is part of: a pipeline's stages are 0, 1, ...; a tensor-parallel
 * group's ranks all 0; in a chain, a group's ranks (its leader first) share their group's.
 */
ring_stage: number, };

/**
 * How a model is split over nodes.
 */
export type Parallelism = "pipeline" | "tensor" | "chain";

/**
 * Another way the model could have been split, as placement weighed it.
 */
export type Alternative = { parallel: Parallelism, 
/**
 * Its nodes, in order (none when it fits nowhere).
 */
nodes: Array<string>, expected_decode_tokens_per_second: number | null, 
/**
 * Why it was not chosen, or why it cannot run.
 */
reason: string, };

export type Plan = { model: string, context: number, 
/**
 * Tokens in the model's vocabulary (valid ids are below it).
 */
vocabulary: number, stages: Array<StagePlan>, total_bytes: number, 
/**
 * KV-cache bytes 1024 tokens of one request take across all stages (what a longer context costs).
 */
kv_cache_per_1k_tokens: number, 
/**
 * Bytes of one request's recurrent state across all stages (linear-attention layers keep it in
 * place of KV rows; it does not grow with the context). Included in the stages' `kv_cache`.
 */
recurrent_state_per_sequence: number, 
/**
 * Tokens of saved prefixes (the prompt cache beyond the slots) every stage keeps in memory: as many
 * as asked for (by default a context per slot) where each stage's node offers the memory beyond
 * what the plan takes, else as many as it does; 0 where the stages save none (a tensor-parallel
 * group, sliding-window layers). See [`saved_prefix_tokens`].
 */
saved_prefix_tokens: number, 
/**
 * Expected time a token spends crossing the links: around a pipeline's ring (half the RTT plus the
 * hidden state's transfer per hop, and the sampled token's way back), or in a tensor-parallel
 * group's sums (two per layer) and its logits' way to the leader.
 */
ring_us: number, 
/**
 * 1 / (the stages' step times + ring time), or for a tensor-parallel group 1 / (its slowest rank's
 * step time + link time), when every node's bandwidth is known.
 */
expected_decode_tokens_per_second: number | null, 
/**
 * How the model is split.
 */
parallel: Parallelism, 
/**
 * The other way, as weighed: its prediction and why it was not chosen.
 */
alternatives: Array<Alternative>, };

export type InstanceInfo = { id: string, 
/**
 * The name clients use (`model` in the OpenAI API).
 */
model: string, model_path: string, owner: NodeId, state: InstanceState, error: string | null, context: number, sequences: number, created_at_ms: number, plan: Plan, stages: Array<StageStatus>, 
/**
 * When every stage was first ready.
 */
ready_at_ms: number | null, 
/**
 * The instance this one replaces, and why (set when it was placed again without a person).
 */
recovery: Recovery | null, 
/**
 * The instance that replaced this one.
 */
replaced_by: string | null, 
/**
 * How it was launched, so that a member can place it again when its owner is gone.
 */
request: LaunchRequest | null, };

/**
 * The element type of a KV cache: F16 (the default), or Q8_0 / Q4_0 blocks of 32 values — about half
 * and a quarter of F16's bytes, for longer contexts in the same memory, at the cost of their rounding.
 */
export type KvType = "f16" | "q8_0" | "q4_0";

/**
 * Whether an instance drafts (a launch option).
 */
export type Speculation = "auto" | "on" | "off";

export type LaunchRequest = { 
/**
 * Path of the GGUF file on the launching node (the other nodes find it in their library or fetch
 * their share of it).
 */
model: string, 
/**
 * Explicit placement, `NODE:0-9,NODE:10-29`.
 */
layers?: string | null, 
/**
 * Context of each request, in tokens (default 2048).
 */
context?: number | null, 
/**
 * Requests served at once (default 4).
 */
sequences?: number | null, 
/**
 * Compute threads per stage (default: the node's cores divided by its stages).
 */
threads?: number | null, 
/**
 * Most prompt tokens a step takes (default 512): a longer prompt runs in chunks of at most this
 * many. A larger batch takes a larger compute buffer on every stage.
 */
batch?: number | null, 
/**
 * The KV cache's element type on every stage (default f16; q8_0 and q4_0 hold about twice and
 * four times the context in the same memory).
 */
kv_type?: KvType | null, 
/**
 * Tokens of saved prefixes (the prompt cache beyond the slots) to keep in memory, as far as the
 * nodes' memory beyond the plan allows (default: one more context per slot; 0 keeps none).
 */
prompt_cache?: number | null, 
/**
 * Whether requests draft tokens from their own history and verify them in one step (speculative
 * decoding; default auto: where the model keeps enough of them to pay for the drafts).
 */
speculation?: Speculation | null, 
/**
 * Most drafted tokens a request's step carries (default 8, at most 32).
 */
draft_tokens?: number | null, 
/**
 * Most tokens any reply may have, whatever a request asks (default: up to the context's end).
 * Bounds what a client that sets no limit (an agent) can make the instance generate.
 */
max_reply_tokens?: number | null, 
/**
 * The name clients use (default: the file name without `.gguf`).
 */
name?: string | null, 
/**
 * How to split the model: a pipeline of layer ranges, tensor parallel, or a chain of groups
 * (default: the fastest placement predicts).
 */
parallel?: Parallelism | null, 
/**
 * Run it on exactly these nodes (names or id prefixes), in this order: the ring of a pipeline, or
 * the ranks of a tensor-parallel group (the first leads).
 */
nodes?: Array<string> | null, };

/**
 * What a stage's node will fetch at launch, as a preview shows it.
 */
export type ShareNeed = { 
/**
 * The header and the stage's tensors: what comes over when the node has nothing of the file.
 */
bytes: number, 
/**
 * The member it would come from (the fastest measured link to that node with the whole file), or
 * the hub; None when neither has it (the launch would fail).
 */
from: string | null, };

export type PlacementPreview = { model: string, plan: Plan, 
/**
 * For each stage: what its node would fetch of the model at launch (null: it has its share).
 */
fetches: Array<ShareNeed | null>, };

/**
 * Counts and rates of one finished request.
 */
export type GenerationReport = { prompt_tokens: number, 
/**
 * Of the prompt's tokens, those the prompt cache gave back (not run again).
 */
cached_tokens: number, generated_tokens: number, 
/**
 * How long the request waited for a slot before its prompt ran (ms).
 */
queue_ms: number, 
/**
 * From its prompt starting to run to its first token (the wait for a slot not included).
 */
time_to_first_token_ms: number, prefill_tokens_per_second: number, decode_tokens_per_second: number, 
/**
 * Median per-hop link time of this request's decode steps (µs), on multi-stage instances.
 */
hop_p50_us: number | null, 
/**
 * Tokens drafted for speculative decoding, and those of them kept (part of `generated_tokens`).
 */
drafted_tokens: number, accepted_tokens: number, 
/**
 * The stop string that ended the request, when one did (`stop_sequence` in Anthropic's API).
 */
stop_sequence?: string | null, };

/**
 * Cluster-wide rates over the last [`WINDOW`].
 */
export type ClusterRates = { prefill_tokens_per_second: number, decode_tokens_per_second: number, requests_per_minute: number, window_seconds: number, };

/**
 * A Thunderbolt cable between two members, as both ends see it.
 */
export type Cable = { a: NodeId, a_receptacle: number | null, a_interface: string | null, b: NodeId, b_receptacle: number | null, b_interface: string | null, 
/**
 * Both ends' link layers are ready for RDMA.
 */
rdma_ready: boolean, };

export type NodeRdma = { node: NodeId, name: string, report: RdmaNodeReport | null, };

export type ClusterRdma = { nodes: Array<NodeRdma>, cables: Array<Cable>, checks: Array<Check>, };

export type WizardStepId = "why" | "prerequisites" | "what_happens" | "recovery" | "waiting_for_reboot" | "verify";

export type FixId = "thunderbolt_bridge" | "link_local_ipv4";

/**
 * What became of a fix.
 */
export type FixOutcome = { "status": "applied", fix: FixId, commands: Array<string>, } | { "status": "cancelled", fix: FixId, commands: Array<string>, } | { "status": "failed", fix: FixId, error: string, commands: Array<string>, } | { "status": "show_only", fix: FixId, reason: string, commands: Array<string>, };

export type WizardState = { started: boolean, step: WizardStepId, 
/**
 * The boot time (seconds since the epoch) when the wizard began waiting for the restart.
 */
boot_time_at_wait: number | null, 
/**
 * The restart was seen: the boot time changed while waiting.
 */
rebooted: boolean, 
/**
 * The fixes made or attempted, latest last.
 */
fixes: Array<FixOutcome>, updated_at_ms: number, };

/**
 * Where the user is relative to a step.
 */
export type StepStatus = "done" | "current" | "upcoming";

export type WizardStep = { id: WizardStepId, title: string, body: Array<string>, 
/**
 * Commands the step asks the user to type (shown for copying).
 */
commands?: Array<string>, status: StepStatus, };

/**
 * The doctor's findings in brief, for the wizard.
 */
export type DoctorSummary = { platform: string, rdma_enabled: boolean | null, usable_interfaces: Array<string>, passed: number, failed: number, unknown: number, checks: Array<Check>, };

/**
 * A fix the doctor's report calls for.
 */
export type Fix = { id: FixId, title: string, explanation: string, 
/**
 * Exactly what runs, as it would be pasted into Terminal (with `sudo`).
 */
commands: Array<string>, 
/**
 * shoal can run it on this node (macOS, behind the administrator prompt).
 */
can_apply: boolean, };

export type VerifyResult = "enabled_and_healthy" | "still_disabled" | "other_failures" | "not_a_mac";

export type Verification = { result: VerifyResult, message: string, 
/**
 * The checks that fail (or cannot be told), with their fixes.
 */
failures: Array<Check>, };

/**
 * Everything `GET /api/rdma/wizard` answers.
 */
export type WizardView = { state: WizardState, steps: Array<WizardStep>, doctor: DoctorSummary, fixes: Array<Fix>, 
/**
 * Present at the verification step.
 */
verification: Verification | null, };

export type WizardResponse = { 
/**
 * What became of the fix asked for.
 */
outcome?: FixOutcome, state: WizardState, steps: Array<WizardStep>, doctor: DoctorSummary, fixes: Array<Fix>, 
/**
 * Present at the verification step.
 */
verification: Verification | null, };

/**
 * What the user asked for (`POST /api/rdma/wizard`).
 */
export type WizardAction = { "action": "start" } | { "action": "next" } | { "action": "back" } | { "action": "reset" } | { "action": "apply_fix", fix: FixId, };

/**
 * Where a model file was found.
 */
export type ModelSource = { "kind": "shoal" } | { "kind": "hugging_face", repo: string, revision: string, } | { "kind": "added" };

/**
 * What a shard holds (see [`super::shard`]).
 */
export type ShardSummary = { 
/**
 * The layers present, as `shoal pull --layers` writes them: `10-20` (both included), comma-separated.
 */
layers: string, 
/**
 * The same layer ranges, end exclusive.
 */
ranges: Array<{ start: number, end: number, }>, 
/**
 * Bytes present (header and fetched tensors).
 */
present_bytes: number, 
/**
 * Bytes of the whole file.
 */
file_bytes: number, };

/**
 * One model: a GGUF file, or all parts of a split GGUF set.
 */
export type LibraryModel = { 
/**
 * The model's name: its file name without `.gguf` (of a split set, without the part number) — the
 * name a launch gives its instance by default, and so the one the APIs serve it by.
 */
name: string, 
/**
 * The name the file gives itself (`general.name`), when it has one: a title to show beside `name`.
 */
title: string | null, 
/**
 * The file to open: the only file, or the first part of a split set.
 */
path: string, 
/**
 * Every file of the model, in order (one unless split).
 */
parts: Array<string>, source: ModelSource, 
/**
 * Bytes of all parts together; for a shard, only the bytes present.
 */
size_bytes: number, architecture: string | null, 
/**
 * Number of weights (elements of every tensor of every part).
 */
parameters: number | null, 
/**
 * The file type (`general.file_type`), such as Q4_K_M.
 */
quantization: string | null, layers: number | null, context_length: number | null, 
/**
 * Whether shoal's engine can run this model as it is.
 */
runnable: boolean, 
/**
 * Why it cannot be run or read, when it cannot.
 */
problem: string | null, 
/**
 * What shoal leaves out of a model it runs (its next-token-prediction layers), when anything.
 */
note: string | null, 
/**
 * Set when the file is a shard (fetched with `shoal pull --layers`): only some layers are present.
 */
shard: ShardSummary | null, };

/**
 * A model against the cluster's memory pool.
 */
export type Fit = { 
/**
 * A launch with the defaults would be placed now.
 */
fits: boolean, 
/**
 * Nodes the plan uses; when it does not fit, the nodes its best split was tried on.
 */
nodes: number, 
/**
 * Bytes the model needs (weights, KV cache and compute buffers of every stage) on those nodes.
 */
needed_bytes: number, 
/**
 * What the nodes that are up offer together.
 */
pool_bytes: number, 
/**
 * What the best split lacks, stage by stage (0 when it fits).
 */
missing_bytes: number, 
/**
 * The context (tokens per request) and concurrent requests the check assumed: a launch's defaults.
 */
context: number, sequences: number, 
/**
 * Why it does not fit, in the planner's words.
 */
reason: string | null, };

export type ModelWithFit = { fit: Fit | null, 
/**
 * The model's name: its file name without `.gguf` (of a split set, without the part number) — the
 * name a launch gives its instance by default, and so the one the APIs serve it by.
 */
name: string, 
/**
 * The name the file gives itself (`general.name`), when it has one: a title to show beside `name`.
 */
title: string | null, 
/**
 * The file to open: the only file, or the first part of a split set.
 */
path: string, 
/**
 * Every file of the model, in order (one unless split).
 */
parts: Array<string>, source: ModelSource, 
/**
 * Bytes of all parts together; for a shard, only the bytes present.
 */
size_bytes: number, architecture: string | null, 
/**
 * Number of weights (elements of every tensor of every part).
 */
parameters: number | null, 
/**
 * The file type (`general.file_type`), such as Q4_K_M.
 */
quantization: string | null, layers: number | null, context_length: number | null, 
/**
 * Whether shoal's engine can run this model as it is.
 */
runnable: boolean, 
/**
 * Why it cannot be run or read, when it cannot.
 */
problem: string | null, 
/**
 * What shoal leaves out of a model it runs (its next-token-prediction layers), when anything.
 */
note: string | null, 
/**
 * Set when the file is a shard (fetched with `shoal pull --layers`): only some layers are present.
 */
shard: ShardSummary | null, };

/**
 * Where a download is.
 */
export type PullState = "resolving" | "downloading" | "verifying" | "done" | "failed";

/**
 * A download's progress over all its files.
 */
export type PullProgress = { 
/**
 * The file being transferred now.
 */
file: string, bytes_done: number, bytes_total: number, 
/**
 * Bytes per second since the transfer (re)started.
 */
rate_bytes_per_second: number, eta_seconds: number | null, state: PullState, };

/**
 * What to download: `REPO` (its GGUF model) or `REPO:FILE` (a file, or a quantization such as Q4_K_M).
 */
export type HubPullRequest = { repo: string, file?: string | null, revision?: string | null, };

/**
 * A pull: the hub request, and the layers or the rank when only a share of the model is wanted.
 */
export type PullRequest = { 
/**
 * `FIRST-LAST` (both included), as `shoal pull --layers` takes it.
 */
layers?: string | null, 
/**
 * `RANK/NODES`, as `shoal pull --rank` takes it: what that node of a tensor-parallel group of equal
 * nodes reads.
 */
rank?: string | null, repo: string, file?: string | null, revision?: string | null, };

export type PullStarted = { id: string, };

/**
 * A file a node offers.
 */
export type OfferedFile = { name: string, size: number, 
/**
 * The Hugging Face repository it came from, when known (`ORG/NAME`).
 */
repo: string | null, 
/**
 * The hub's SHA-256 of the file, when known.
 */
sha256: string | null, 
/**
 * Set when the node holds only a shard of the file: the layers present (`10-19`, as `shoal pull
 * --layers` writes them). Listed so the cluster sees who has which part; never copied.
 */
layers?: string | null, 
/**
 * Of a shard: the byte ranges of the file it holds (as its record has them), so that a placement
 * preview can tell whether a stage's bytes, or a tensor-parallel rank's slice, are all there.
 */
present?: Array<{ start: number, end: number, }> | null, };

/**
 * One node's files.
 */
export type NodeFiles = { node: NodeId, name: string, files: Array<OfferedFile>, 
/**
 * Why the node's list is missing.
 */
error: string | null, };

export type CopyRequest = { 
/**
 * The node to copy from: its name or id.
 */
from: string, 
/**
 * The file's name, as `GET /api/models/cluster` lists it.
 */
file: string, 
/**
 * Its size, as listed: a file of the same name and another size is not it.
 */
size?: number | null, };

export type CopyStarted = { id: string, path: string, };

/**
 * Where a copy stands.
 */
export type CopyProgress = { bytes_done: number, bytes_total: number, bytes_per_second: number, };

/**
 * A finished copy.
 */
export type CopyReport = { path: string, bytes: number, seconds: number, bytes_per_second: number, sha256: string, };

/**
 * An instance that quitting this node would stop.
 */
export type Stopped = { id: string, model: string, 
/**
 * The nodes that run its stages, by name, in ring order, each once; this node as "this node".
 */
nodes: Array<string>, 
/**
 * This node runs none of its stages, only manages it.
 */
only_owned: boolean, };

/**
 * What quitting would stop, and whether quitting here is the app's to do.
 */
export type QuitImpact = { 
/**
 * The instances quitting would stop.
 */
stops: Array<Stopped>, 
/**
 * The sentence that says so (null: nothing would stop).
 */
message: string | null, 
/**
 * Whether this node runs inside the app, which `POST /api/quit` ends.
 */
in_app: boolean, };

/**
 * Changes, in the order they happen, for the UI and any client of `/api/events`.
 */
export type ClusterEvent = { "type": "node_joined", node: NodeId, name: string, } | { "type": "node_status", node: NodeId, status: PeerStatus, } | { "type": "node_left", node: NodeId, } | { "type": "telemetry", node: NodeId, telemetry: NodeTelemetry, } | { "type": "links", node: NodeId, links: Array<LinkReport>, } | { "type": "nearby", clusters: Array<NearbyCluster>, } | { "type": "join_attempt", from: string, accepted: boolean, reason: string, } | { "type": "code_created", expires_at_ms: number, } | { "type": "code_revoked", reason: string, } | { "type": "cluster_changed", cluster_id: string, } | { "type": "instance", info: InstanceInfo, } | { "type": "instance_failed", instance: string, model: string, error: string, } | { "type": "request_finished", model: string, report: GenerationReport, } | { "type": "rates", rates: ClusterRates, } | { "type": "model_pull", id: string, repo: string, 
/**
 * The layers asked for (`FIRST-LAST`, both included) when only a stage's shard is fetched.
 */
layers: string | null, 
/**
 * The rank asked for (`RANK/NODES`) when only a tensor-parallel node's slice is fetched.
 */
rank: string | null, progress: PullProgress, 
/**
 * The downloaded files, once done.
 */
paths: Array<string>, error: string | null, } | { "type": "model_copy", id: string, from: NodeId, to: NodeId, file: string, progress: CopyProgress, done: CopyReport | null, error: string | null, };
