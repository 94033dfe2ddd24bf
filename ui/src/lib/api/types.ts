/**
 * The JSON the node's API speaks, mirrored from the Rust types (src/cluster/state.rs, src/node/telemetry.rs,
 * src/links, src/instances, src/placement, src/worker/protocol.rs, src/metrics, src/rdma, src/model/library.rs,
 * src/model/pull.rs, src/model/peer_copy.rs, src/api/copy.rs). Field names are the wire names; optional fields
 * are ones a newer node may add.
 */

export type NodeId = string;

/** "self" for the node that serves this page, else how it sees the peer. */
export type NodeStatus = 'self' | 'connecting' | 'alive' | 'suspect' | 'down';
export type PeerStatus = Exclude<NodeStatus, 'self'>;

export type Verdict = 'pass' | 'fail' | 'unknown';

export interface Check {
  id: string;
  title: string;
  verdict: Verdict;
  reason: string;
  /** What to do about a failure (empty when it passes). */
  fix: string;
}

export interface ThunderboltLink {
  receptacle: number | null;
  domain_uuid: string | null;
  interface: string | null;
  speed_gbps: number | null;
  peer_name: string;
  peer_domain_uuid: string;
  peer_rdma_service: boolean;
  ipv4: string[];
  rdma_device: string | null;
  port_state: string | null;
}

export interface MacOsVersion {
  version: string;
  build: string;
}

export interface RdmaNodeReport {
  platform: string;
  macos: MacOsVersion | null;
  checks: Check[];
  links: ThunderboltLink[];
  usable_interfaces: string[];
}

export interface NodeTelemetry {
  memory_total: number;
  memory_available: number;
  /** Resident memory of the node's shoal processes (agent and workers). */
  memory_used_by_shoal: number;
  /** What the node offers models: available less headroom, capped by --memory-limit and the GPU limit. */
  memory_offer: number;
  memory_bandwidth: number | null;
  cpu_model: string;
  cpu_cores: number;
  cpu_threads: number;
  load_1m: number;
  os: string;
  os_version: string;
  kernel: string;
  arch: string;
  chip: string | null;
  gpu_memory_limit: number | null;
  gpu_memory_limit_source: string | null;
  rdma?: RdmaNodeReport | null;
  sampled_at_ms: number;
}

export interface NodeView {
  id: NodeId;
  name: string;
  is_self: boolean;
  status: NodeStatus;
  control: string[];
  api_port: number;
  last_heard_ms_ago: number | null;
  telemetry: NodeTelemetry | null;
}

export type LinkKind = 'loopback' | 'ethernet' | 'wifi' | 'thunderbolt' | 'unknown';

/**
 * The transport the ring uses on a link as one end chose it: RDMA with its device, or TCP and why
 * (with when RDMA is tried again after a failure). Older nodes do not report it: then it is TCP.
 */
export type LinkTransport =
  | { kind: 'rdma'; device: string }
  | { kind: 'tcp'; reason: string; retry_at_ms?: number };

export interface LinkReport {
  peer: NodeId;
  kind: LinkKind;
  interface: string | null;
  local_addr: string | null;
  remote_addr: string | null;
  rtt_p50_us: number | null;
  rtt_p99_us: number | null;
  rtt_samples: number;
  throughput_bps: number | null;
  throughput_measured_at_ms: number | null;
  errors: number;
  transport?: LinkTransport;
}

export interface LinkView {
  a: NodeId;
  b: NodeId;
  kind: LinkKind;
  rtt_p50_us: number | null;
  rtt_p99_us: number | null;
  throughput_a_to_b_bps: number | null;
  throughput_b_to_a_bps: number | null;
  errors: number;
  reports: LinkReport[];
}

export interface PoolView {
  nodes_up: number;
  memory_total: number;
  memory_available: number;
  memory_used_by_shoal: number;
  gpu_memory_limit: number;
}

export interface NearbyNodeView {
  id: NodeId;
  name: string;
  control: string[];
  api_port: number;
}

export interface NearbyCluster {
  cluster_id: string;
  nodes: NearbyNodeView[];
}

export interface ClusterSnapshot {
  cluster_id: string;
  node_id: NodeId;
  nodes: NodeView[];
  links: LinkView[];
  pool: PoolView;
  nearby: NearbyCluster[];
  join_code_expires_at_ms: number | null;
}

/**
 * `recovering`: it lost a node or a worker and its owner is placing it again (its `error` says what
 * happened and what it lacks); `replaced`: placed again as the instance `replaced_by` names.
 */
export type InstanceState = 'launching' | 'ready' | 'recovering' | 'failed' | 'stopped' | 'replaced';

/** Why an instance exists: it replaces one that lost a node or a worker. */
export interface Recovery {
  replaces: string;
  reason: string;
  attempt: number;
}
/** `fetching`: the stage's node is fetching its share of the model (see {@link StageFetch}) before it starts. */
export type WorkerState = 'starting' | 'fetching' | 'loading' | 'connecting' | 'ready' | 'serving' | 'failed' | 'stopped';

/** A Rust `Range<usize>`: `start` included, `end` excluded. */
export interface LayerRange {
  start: number;
  end: number;
}

export interface StageBytes {
  weights: number;
  kv_cache: number;
  compute: number;
}

export interface StageStats {
  steps: number;
  tokens: number;
  compute_us_total: number;
  requests: number;
  generated_tokens: number;
  hop_p50_us: number | null;
  hop_p99_us: number | null;
  active_requests: number;
}

/**
 * A stage's fetch of its share of the model (the file's header and the stage's tensors) by a node that
 * lacked it, from another member or the Hugging Face hub. It stays on the stage once done.
 */
export interface StageFetch {
  /** The member the bytes come from; null when they come from the hub. */
  from_node: NodeId | null;
  /** That member's name, or "Hugging Face (ORG/NAME)". */
  from: string;
  bytes_done: number;
  /** The header and the stage's tensors. */
  bytes_total: number;
  /** Bytes that came over the network, not those already here (final once done). */
  bytes_fetched: number;
  bytes_per_second: number;
  done: boolean;
}

export interface StageStatus {
  node: NodeId;
  node_name: string;
  layers: LayerRange;
  state: WorkerState;
  /** Loading progress 0..1; while the state is `fetching`, the fraction of the share fetched. */
  progress: number;
  data_port: number | null;
  memory: StageBytes | null;
  stats: StageStats | null;
  error: string | null;
  /** The fetch of the stage's share, when its node lacked it. */
  fetch: StageFetch | null;
}

export interface StagePlan {
  node: NodeId;
  node_name: string;
  layers: LayerRange;
  bytes: StageBytes;
  offer: number;
  expected_step_us: number | null;
}

export interface Plan {
  model: string;
  context: number;
  vocabulary: number;
  stages: StagePlan[];
  total_bytes: number;
  /** KV-cache bytes 1024 tokens of one request take across all stages. */
  kv_cache_per_1k_tokens: number;
  ring_us: number;
  expected_decode_tokens_per_second: number | null;
}

export interface InstanceInfo {
  id: string;
  model: string;
  model_path: string;
  owner: NodeId;
  state: InstanceState;
  error: string | null;
  context: number;
  sequences: number;
  created_at_ms: number;
  plan: Plan;
  stages: StageStatus[];
  ready_at_ms: number | null;
  recovery: Recovery | null;
  replaced_by: string | null;
}

export interface LaunchRequest {
  model: string;
  layers?: string;
  context?: number;
  sequences?: number;
  name?: string;
}

/** What a stage's node would fetch of the model at launch. */
export interface ShareNeed {
  /** The header and the stage's tensors. */
  bytes: number;
  /** The member it would come from, or "Hugging Face (ORG/NAME)"; null when nothing in reach has it. */
  from: string | null;
}

export interface PlacementPreview {
  model: string;
  plan: Plan;
  /** Per stage: null when its node holds its share already (absent from older nodes). */
  fetches?: (ShareNeed | null)[];
}

export interface GenerationReport {
  prompt_tokens: number;
  generated_tokens: number;
  time_to_first_token_ms: number;
  prefill_tokens_per_second: number;
  decode_tokens_per_second: number;
  hop_p50_us: number | null;
}

export interface ClusterRates {
  prefill_tokens_per_second: number;
  decode_tokens_per_second: number;
  requests_per_minute: number;
  window_seconds: number;
}

export interface JoinCode {
  code: string;
  expires_at_ms: number;
  expires_in_seconds: number;
  /** Whether this node advertises itself with mDNS (then the code alone finds it nearby). */
  mdns: boolean;
  /** This node's control addresses, for `--join CODE@HOST:PORT` where multicast does not reach. */
  join_addresses: string[];
}

export interface Cable {
  a: NodeId;
  a_receptacle: number | null;
  a_interface: string | null;
  b: NodeId;
  b_receptacle: number | null;
  b_interface: string | null;
  rdma_ready: boolean;
}

export interface NodeRdma {
  node: NodeId;
  name: string;
  report: RdmaNodeReport | null;
}

export interface ClusterRdma {
  nodes: NodeRdma[];
  cables: Cable[];
  checks: Check[];
}

/** Where a library model was found. */
export type ModelSource = { kind: 'shoal' } | { kind: 'hugging_face'; repo: string; revision: string } | { kind: 'added' };

/** A model of this node's library (GET /api/models). */
export interface LibraryModel {
  /** The file name without `.gguf` (of a split set, without the part number): the name the APIs serve it by. */
  name: string;
  /** The name the file gives itself (`general.name`), shown beside `name`. */
  title?: string | null;
  /** The file to open (the first part of a split set). */
  path: string;
  parts: string[];
  source: ModelSource;
  size_bytes: number;
  architecture: string | null;
  parameters: number | null;
  quantization: string | null;
  layers: number | null;
  context_length: number | null;
  runnable: boolean;
  /** Why it cannot be run or read. */
  problem: string | null;
  /** Set when the file is a shard (`shoal pull --layers`): only these layers are present. */
  shard?: ShardSummary | null;
}

/** What a shard holds (src/model/library.rs). */
export interface ShardSummary {
  /** As `--layers` writes them: `10-20` (both included), comma-separated. */
  layers: string;
  /** The same ranges, end exclusive. */
  ranges: { start: number; end: number }[];
  /** Bytes present (header and fetched tensors); size_bytes says the same. */
  present_bytes: number;
  file_bytes: number;
}

/** Whether a launch with the defaults would be placed on the cluster now (src/instances/fit.rs). */
export interface Fit {
  fits: boolean;
  /** Nodes the plan uses; when it does not fit, the nodes its best split was tried on. */
  nodes: number;
  needed_bytes: number;
  /** What the nodes that are up offer together. */
  pool_bytes: number;
  /** What the best split lacks, stage by stage (0 when it fits). */
  missing_bytes: number;
  context: number;
  sequences: number;
  /** Why not, in the planner's words. */
  reason: string | null;
}

/** A library model with its fit (GET /api/models/fit); null when it cannot run. */
export interface ModelWithFit extends LibraryModel {
  fit: Fit | null;
}

export type PullState = 'resolving' | 'downloading' | 'verifying' | 'done' | 'failed';

export interface PullProgress {
  file: string;
  bytes_done: number;
  bytes_total: number;
  rate_bytes_per_second: number;
  eta_seconds: number | null;
  state: PullState;
}

/** POST /api/models/pull: `repo` is ORG/NAME, or ORG/NAME:FILE or ORG/NAME:QUANT. */
export interface PullRequest {
  repo: string;
  revision?: string;
  /** Only a stage's shard: FIRST-LAST, both included. */
  layers?: string;
}

export interface PullStarted {
  id: string;
}

/**
 * A GGUF file a node offers the other members (every part of a split model is one), or a shard of one it
 * holds (then `layers` is set): a shard is listed so the cluster sees who has which part, never copied.
 */
export interface OfferedFile {
  name: string;
  /** The whole file's size, for a shard too. */
  size: number;
  /** The Hugging Face repository it came from (ORG/NAME), when known. */
  repo: string | null;
  /** The hub's SHA-256 of the file, when known. */
  sha256: string | null;
  /**
   * Set when the node holds only a shard of the file: the layers present, as `shoal pull --layers`
   * writes them ("10-19", or "0-9, 20-29"). Absent for a complete file, the only kind POST
   * /api/models/copy copies.
   */
  layers?: string;
}

/** One member's files (GET /api/models/cluster lists every member that is up, this node included). */
export interface NodeFiles {
  node: NodeId;
  name: string;
  files: OfferedFile[];
  /** Why the node's list is missing (it did not answer, no connection to it). */
  error: string | null;
}

/** POST /api/models/copy: `from` is a member's name or id, `file` a name GET /api/models/cluster lists
 * (with its size, when the list gave one, so a same-named file of another size is never sent instead). */
export interface CopyRequest {
  from: string;
  file: string;
  size?: number;
}

export interface CopyStarted {
  id: string;
  /** Where the file will be on this node. */
  path: string;
}

export interface CopyProgress {
  bytes_done: number;
  bytes_total: number;
  bytes_per_second: number;
}

/** A finished copy: the SHA-256 of what arrived agreed with the sender's. */
export interface CopyReport {
  path: string;
  bytes: number;
  seconds: number;
  bytes_per_second: number;
  sha256: string;
}

/** Every change the node streams on /api/events, by `type` (also the SSE event name). */
export type ClusterEvent =
  | { type: 'node_joined'; node: NodeId; name: string }
  | { type: 'node_status'; node: NodeId; status: PeerStatus }
  | { type: 'node_left'; node: NodeId }
  | { type: 'telemetry'; node: NodeId; telemetry: NodeTelemetry }
  | { type: 'links'; node: NodeId; links: LinkReport[] }
  | { type: 'nearby'; clusters: NearbyCluster[] }
  | { type: 'join_attempt'; from: string; accepted: boolean; reason: string }
  | { type: 'code_created'; expires_at_ms: number }
  | { type: 'code_revoked'; reason: string }
  | { type: 'cluster_changed'; cluster_id: string }
  | { type: 'instance'; info: InstanceInfo }
  | { type: 'instance_failed'; instance: string; model: string; error: string }
  | { type: 'request_finished'; model: string; report: GenerationReport }
  | { type: 'rates'; rates: ClusterRates }
  | {
      type: 'model_pull';
      id: string;
      repo: string;
      /** The layers asked for ("10-19") when only a stage's shard is fetched; null for the whole file. */
      layers: string | null;
      progress: PullProgress;
      paths: string[];
      error: string | null;
    }
  | {
      type: 'model_copy';
      id: string;
      from: NodeId;
      to: NodeId;
      file: string;
      progress: CopyProgress;
      /** The report, on the last event of a copy that worked. */
      done: CopyReport | null;
      /** Why it failed, on the last event of a copy that did not. */
      error: string | null;
    }
  | { type: 'lagged' };

export type ClusterEventType = ClusterEvent['type'];

export const CLUSTER_EVENT_TYPES: readonly ClusterEventType[] = [
  'node_joined',
  'node_status',
  'node_left',
  'telemetry',
  'links',
  'nearby',
  'join_attempt',
  'code_created',
  'code_revoked',
  'cluster_changed',
  'instance',
  'instance_failed',
  'request_finished',
  'rates',
  'model_pull',
  'model_copy',
  'lagged',
];

/** The error body of every failed API call (OpenAI's shape). */
export interface ApiErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}
