//! Placement on the real SmolLM2 file's sizes: fitting, preferring fewer nodes, heterogeneous nodes,
//! link-aware ring order, explicit overrides, and what "does not fit" says (in words and in numbers).

mod common;

use shoal::model::Model;
use shoal::node::NodeId;
use shoal::placement::{self, LinkCost, ModelNeeds, NodeOffer, PlacementError};

const MB: u64 = 1_000_000;

fn needs() -> ModelNeeds {
    let model = Model::open(&common::model_path()).unwrap();
    ModelNeeds::of(&model, 256, 1, 256)
}

fn node(name: &str, mb: u64) -> NodeOffer {
    NodeOffer {
        id: NodeId::random(),
        name: name.into(),
        bytes: mb * MB,
        memory_bandwidth: Some(10_000 * MB),
        weight_rate: None,
    }
}

fn link(a: &NodeOffer, b: &NodeOffer, rtt_us: u64, bps: u64) -> LinkCost {
    LinkCost { a: a.id, b: b.id, rtt_us: Some(rtt_us), throughput_bps: Some(bps) }
}

#[test]
fn stage_needs_are_the_files_bytes_plus_cache_and_buffers() {
    let n = needs();
    // The file's tensors, read by the tests' own GGUF reader.
    let table = common::tensor_table::read(&common::model_path());
    let middle = n.stage(10..20);
    assert_eq!(middle.weights, table.stage_bytes(10..20, 30));
    // K and V, F16, 3 heads of 64, 256 positions, in each of the 10 layers.
    assert_eq!(middle.kv_cache, 10 * 2 * 2 * 192 * 256);
    assert_eq!(n.kv_per_layer, vec![2 * 2 * 192 * 256; 30]);
    // The tied output head makes the last stage hold the embedding matrix too.
    assert_eq!(n.stage(20..30).weights, table.stage_bytes(20..30, 30));
    assert!(table.stage(20..30, 30).iter().any(|t| t.name == "token_embd.weight"));
    assert_eq!(n.stage(0..30).weights, table.tensors.iter().map(|t| t.bytes).sum::<u64>());
}

#[test]
fn a_decode_step_reads_its_weights_and_its_attentions_cache_rows() {
    let n = needs();
    // At the predicted depth (64 positions), each of SmolLM2's 9 query heads reads a 64-wide F16 key row
    // and value row per position; 3 heads share each key/value head and each counts it.
    let per_layer = 9 * 64 * 2 * 64 * 2;
    assert_eq!(placement::DECODE_DEPTH, 64);
    assert_eq!(n.attention_reads, vec![per_layer; 30]);
    let weights_only = n.stage_reads(0..10) - 10 * per_layer;
    let table = common::tensor_table::read(&common::model_path());
    assert_eq!(
        weights_only,
        table.stage_bytes(0..10, 30)
            - table.stage(0..10, 30).iter().filter(|t| t.name == "token_embd.weight").map(|t| t.bytes).sum::<u64>()
    );
    // In the rate mix, attention is F16 in rows of a head's width.
    let attention = n.weight_mix.last().unwrap();
    assert_eq!(
        (attention.dtype.as_str(), attention.bytes, attention.bytes / attention.rows),
        ("f16", 30 * per_layer, 128)
    );
    // A tensor-parallel rank reads its slice's weights but the token embeddings, and its own query
    // heads' share of the attention (SmolLM2 halves as 5 and 4 heads).
    let (slice, bytes) = &n.groups[0].slices[0];
    assert_eq!(slice.query_heads.len(), 5);
    assert_eq!(n.rank_dense_reads(slice, *bytes), bytes - n.layout.embedding + 30 * per_layer * 5 / 9);
    assert_eq!(n.expert_slot_reads(), 0, "a dense model chooses no experts");
}

#[test]
fn one_node_with_room_takes_the_whole_model() {
    let nodes = [node("big", 400), node("small", 100)];
    let plan = placement::plan(&needs(), &nodes, &[]).unwrap();
    assert_eq!(plan.stages.len(), 1);
    assert_eq!(plan.stages[0].node_name, "big");
    assert_eq!(plan.stages[0].layers, 0..30);
    assert_eq!(plan.ring_us, 0);
    // SmolLM2: 30 layers of K and V, 3 KV heads of 64, F16, for 1024 positions.
    assert_eq!(plan.kv_cache_per_1k_tokens, 30 * 2 * 192 * 2 * 1024);
}

#[test]
fn three_small_nodes_share_the_model() {
    let nodes = [node("a", 64), node("b", 64), node("c", 64)];
    let plan = placement::plan(&needs(), &nodes, &[]).unwrap();
    assert_eq!(plan.stages.len(), 3, "{plan:#?}");
    assert_eq!(plan.stages[0].layers.start, 0);
    assert_eq!(plan.stages[2].layers.end, 30);
    for w in plan.stages.windows(2) {
        assert_eq!(w[0].layers.end, w[1].layers.start);
    }
    for s in &plan.stages {
        assert!(s.bytes.total() <= s.offer, "{s:?}");
    }
    // Two of them cannot hold it: fewer nodes are preferred only when they fit.
    assert!(placement::plan(&needs(), &nodes[..2], &[]).is_err());
}

#[test]
fn heterogeneous_nodes_get_shares_that_fit_them() {
    let nodes = [node("large", 110), node("medium", 55), node("tiny", 5)];
    let plan = placement::plan(&needs(), &nodes, &[]).unwrap();
    let names: Vec<&str> = plan.stages.iter().map(|s| s.node_name.as_str()).collect();
    assert_eq!(plan.stages.len(), 2, "{plan:#?}");
    assert!(!names.contains(&"tiny"));
    let large = plan.stages.iter().find(|s| s.node_name == "large").unwrap();
    let medium = plan.stages.iter().find(|s| s.node_name == "medium").unwrap();
    assert!(large.layers.len() > medium.layers.len(), "the larger node holds more layers: {plan:#?}");
}

#[test]
fn the_ring_avoids_slow_links() {
    // Of four equal nodes, any two suffice; c and d share the fastest link.
    let (a, b, c, d) = (node("a", 100), node("b", 100), node("c", 100), node("d", 100));
    let links = [
        link(&a, &b, 5_000, 1_000_000_000),
        link(&a, &c, 1_000, 1_000_000_000),
        link(&a, &d, 1_000, 1_000_000_000),
        link(&b, &c, 1_000, 1_000_000_000),
        link(&b, &d, 1_000, 1_000_000_000),
        link(&c, &d, 100, 10_000_000_000),
    ];
    let plan = placement::plan(&needs(), &[a, b, c.clone(), d.clone()], &links).unwrap();
    let mut used: Vec<&str> = plan.stages.iter().map(|s| s.node_name.as_str()).collect();
    used.sort();
    assert_eq!(used, ["c", "d"]);

    // Three nodes needed; the slow a–c link should carry only the token back to stage 0.
    let (a, b, c) = (node("a", 64), node("b", 64), node("c", 64));
    let links = [link(&a, &b, 100, 10_000_000_000), link(&b, &c, 100, 10_000_000_000), link(&a, &c, 100, 10_000_000)];
    let plan = placement::plan(&needs(), &[a, b, c], &links).unwrap();
    assert_eq!(plan.stages[1].node_name, "b", "{plan:#?}");
}

#[test]
fn overrides_are_honoured_or_refused_with_a_reason() {
    let nodes = [node("a", 64), node("b", 64), node("c", 64)];
    let n = needs();
    let plan =
        placement::plan_override(&n, &nodes, &[], &placement::parse_layers("c:0-9,a:10-19,b:20-29").unwrap()).unwrap();
    let order: Vec<&str> = plan.stages.iter().map(|s| s.node_name.as_str()).collect();
    assert_eq!(order, ["c", "a", "b"]);
    let err =
        placement::plan_override(&n, &nodes, &[], &placement::parse_layers("a:0-27,b:28-29").unwrap()).unwrap_err();
    assert!(matches!(&err, PlacementError::DoesNotFit(m) if m.contains("a needs")), "{err}");
    let gap =
        placement::plan_override(&n, &nodes, &[], &placement::parse_layers("a:0-9,b:11-29").unwrap()).unwrap_err();
    assert!(gap.to_string().contains("starts at 11"), "{gap}");
    let unknown = placement::plan_override(&n, &nodes, &[], &placement::parse_layers("z:0-29").unwrap()).unwrap_err();
    assert!(unknown.to_string().contains("no node up is called z"));
}

#[test]
fn an_override_name_is_not_mistaken_for_the_start_of_another_nodes_id() {
    // A node whose id starts with "b" beside a node called "b": "b" means the node called b.
    let mut other = node("x", 100);
    other.id = NodeId(uuid::Uuid::parse_str("b0000000-0000-4000-8000-000000000000").unwrap());
    let nodes = [node("a", 100), node("b", 100), other.clone()];
    let plan =
        placement::plan_override(&needs(), &nodes, &[], &placement::parse_layers("a:0-14,b:15-29").unwrap()).unwrap();
    assert_eq!(plan.stages[1].node_name, "b");
    // Four or more characters of an id still name its node.
    let plan = placement::plan_override(&needs(), &nodes, &[], &placement::parse_layers("a:0-14,b000:15-29").unwrap())
        .unwrap();
    assert_eq!(plan.stages[1].node_name, "x");
}

#[test]
fn a_model_that_does_not_fit_says_how_much_is_missing_and_where() {
    let nodes = [node("a", 40), node("b", 40), node("c", 40)];
    let err = placement::plan(&needs(), &nodes, &[]).unwrap_err();
    let PlacementError::DoesNotFit(message) = err else { panic!("{err:?}") };
    assert!(message.contains("missing"), "{message}");
    assert!(message.contains("short"), "{message}");
    for name in ["a ", "b ", "c "] {
        assert!(message.contains(name), "{message}");
    }
    // What three stages need, from the file (read by the tests' own GGUF reader) and the formula:
    // every tensor once and the embedding again, as the tied output head, on the last stage; K and V, F16, 3 heads of 64, 256 positions, in 30 layers; a compute buffer per stage and
    // the logits on the last. The nodes offer what this test gave them.
    let n = needs();
    let table = common::tensor_table::read(&common::model_path());
    let embedding = table.tensors.iter().find(|t| t.name == "token_embd.weight").unwrap().bytes;
    let weights = table.tensors.iter().map(|t| t.bytes).sum::<u64>() + embedding;
    let kv_cache = 30 * 2 * 2 * 192 * 256;
    let compute = 3 * n.compute + n.compute_last_extra;
    let needed = weights + kv_cache + compute;
    let offered = 3 * 40 * MB;
    assert!(message.contains(&format!("{:.1} MB missing", (needed - offered) as f64 / 1e6)), "{message}");
    // The same in numbers.
    let short = placement::shortfall(&n, &nodes, &[]).unwrap();
    assert_eq!((short.nodes, short.needed, short.offered), (3, needed, offered));
    assert!(short.missing >= needed - offered, "{short:?}");
    assert_eq!(placement::shortfall(&n, &[], &[]), None);
}

/// Each mode's decode rate is predicted from the nodes' weight rate and the links: over links as fast as
/// veth here (measured p50 round trip ~50 µs) a two-node tensor-parallel group beats the one node a
/// pipeline would use and is chosen, saying why; over a slow link (2 ms, Wi-Fi-like) its 60 sums a token
/// cost more than half the weights save, and the pipeline is kept with the group's prediction beside it.
/// A forced mode that cannot fit is refused with the reason.
#[test]
fn placement_takes_tensor_parallel_over_fast_links_and_a_pipeline_over_slow_ones() {
    let needs = needs();
    // 2.5 GB/s: one thread's Q4 rate on the 2-core VM (engine::weight_rate).
    let rated = |name: &str| NodeOffer { weight_rate: Some(2_500 * MB), ..node(name, 1_000) };
    let (a, b) = (rated("a"), rated("b"));
    let nodes = [a.clone(), b.clone()];

    let fast = placement::plan_mode(&needs, &nodes, &[link(&a, &b, 50, 10_000 * MB)], None).unwrap();
    assert_eq!(fast.parallel, placement::Parallelism::Tensor);
    assert_eq!(fast.stages.len(), 2);
    let one_node = &fast.alternatives[0];
    assert_eq!(one_node.parallel, placement::Parallelism::Pipeline);
    assert_eq!(one_node.nodes.len(), 1, "the pipeline alternative is the model on one node");
    assert!(one_node.reason.contains("predicted"), "{}", one_node.reason);
    let (group_rate, single_rate) =
        (fast.expected_decode_tokens_per_second.unwrap(), one_node.expected_decode_tokens_per_second.unwrap());
    assert!(group_rate >= 1.15 * single_rate, "{group_rate} against {single_rate}");
    // One node reads the model's ~98 MB a token at 2.5 GB/s: about 25 tokens/s.
    assert!((20.0..30.0).contains(&single_rate), "{single_rate}");

    let slow = placement::plan_mode(&needs, &nodes, &[link(&a, &b, 2_000, 100 * MB)], None).unwrap();
    assert_eq!(slow.parallel, placement::Parallelism::Pipeline);
    assert_eq!(slow.stages.len(), 1);
    let group = &slow.alternatives[0];
    assert_eq!(group.parallel, placement::Parallelism::Tensor);
    assert!(group.reason.contains("less than the 1.15x"), "{}", group.reason);
    assert!(group.expected_decode_tokens_per_second.unwrap() < slow.expected_decode_tokens_per_second.unwrap());

    // Forced onto nodes too small for a slice each: refused, saying what each would need.
    let small = [NodeOffer { weight_rate: Some(2_500 * MB), ..node("s1", 30) }, rated("s2")];
    let links = [link(&small[0], &small[1], 50, 10_000 * MB)];
    let error = placement::plan_mode(&needs, &small, &links, Some(placement::Parallelism::Tensor)).unwrap_err();
    assert!(
        error.to_string().contains("tensor parallel cannot run") && error.to_string().contains("more than"),
        "{error}"
    );
}

/// A group of unlike nodes: each rank's share of the heads, feed-forward and vocabulary follows its
/// node's weight rate (the ranks wait for each other at every sum, so the slowest sets the pace), and a
/// node whose memory cannot hold that much takes what it can while the others take the rest. Every
/// rank's bytes are exact (the divider's, equal to the file's tensor by tensor) and fit its node.
#[test]
fn a_group_of_unlike_nodes_divides_the_model_by_speed_and_memory() {
    let needs = needs();
    let model = Model::open(&common::model_path()).unwrap();
    let rated = |name: &str, mb: u64, rate_mb: u64| NodeOffer { weight_rate: Some(rate_mb * MB), ..node(name, mb) };
    let forced = Some(placement::Parallelism::Tensor);
    let heads = |plan: &placement::Plan| -> Vec<usize> {
        plan.stages.iter().map(|s| s.slice.as_ref().unwrap().query_heads.len()).collect()
    };
    let held = |plan: &placement::Plan, name: &str| {
        plan.stages.iter().find(|s| s.node_name == name).unwrap().slice.as_ref().unwrap().query_heads.len()
    };
    let exact = |plan: &placement::Plan| {
        for s in &plan.stages {
            let slice = s.slice.as_ref().unwrap();
            assert_eq!(s.bytes.weights, shoal::model::slice::rank_bytes(&model, slice).unwrap(), "{}", s.node_name);
            assert!(s.bytes.total() <= s.offer, "{} holds {} of {}", s.node_name, s.bytes.total(), s.offer);
        }
        // The shares the workers are given plan the same slices.
        let shares: Vec<f64> = plan.stages.iter().map(|s| s.share.unwrap()).collect();
        let planned = shoal::model::slice::plan(&model, &shares).unwrap();
        assert!(plan.stages.iter().zip(&planned).all(|(s, p)| s.slice.as_ref() == Some(p)));
    };

    // Alike nodes: equal shares, as before.
    let (a, b) = (rated("a", 1_000, 2_500), rated("b", 1_000, 2_500));
    let even = placement::plan_mode(&needs, &[a.clone(), b.clone()], &[link(&a, &b, 50, 10_000 * MB)], forced).unwrap();
    assert_eq!(heads(&even), [5, 4]);
    exact(&even);

    // One node reads weights three times as fast: it takes about three quarters of every part, and the
    // group is predicted faster than with equal shares (where the slow node would set the pace).
    let (fast, slow) = (rated("fast", 1_000, 7_500), rated("slow", 1_000, 2_500));
    let links = [link(&fast, &slow, 50, 10_000 * MB)];
    let by_speed = placement::plan_mode(&needs, &[fast.clone(), slow.clone()], &links, forced).unwrap();
    assert_eq!(heads(&by_speed), [7, 2], "{by_speed:#?}");
    let ffn: Vec<usize> = by_speed.stages.iter().map(|s| s.slice.as_ref().unwrap().feed_forward.len()).collect();
    assert!(ffn[0] > 2 * ffn[1], "{ffn:?}");
    exact(&by_speed);
    let swapped = placement::plan_mode(&needs, &[slow.clone(), fast.clone()], &links, forced).unwrap();
    assert_eq!((held(&swapped, "fast"), held(&swapped, "slow")), (7, 2), "the order given does not matter");

    // Equal speeds, but one node has too little memory for half: it holds less and the other the rest.
    // Equal shares need about 80 MB each here.
    let each = needs.groups[0].slices.iter().map(|(s, w)| needs.rank(s, *w).total()).max().unwrap();
    let small_mb = each / MB - 12;
    let (small, large) = (rated("small", small_mb, 2_500), rated("large", 1_000, 2_500));
    let links = [link(&small, &large, 50, 10_000 * MB)];
    let by_memory = placement::plan_mode(&needs, &[small.clone(), large.clone()], &links, forced).unwrap();
    assert!(
        held(&by_memory, "small") < held(&by_memory, "large"),
        "the small node holds fewer heads: {:?} ({small_mb} MB against {} MB each)",
        heads(&by_memory),
        each / MB
    );
    exact(&by_memory);
    // Chosen by placement itself too, when the group is the faster way.
    let chosen = placement::plan_mode(&needs, &[small.clone(), large.clone()], &links, None).unwrap();
    assert_eq!(chosen.parallel, placement::Parallelism::Tensor);

    // Nodes that cannot hold the model between them: refused, saying what a rank needs at least.
    let tiny = [rated("t1", 40, 2_500), rated("t2", 60, 2_500)];
    let links = [link(&tiny[0], &tiny[1], 50, 10_000 * MB)];
    let error = placement::plan_mode(&needs, &tiny, &links, forced).unwrap_err().to_string();
    assert!(error.contains("no fewer than") && error.contains("more than they offer"), "{error}");
}

/// Two pairs of nodes with fast links within each pair and slow ones between (two Thunderbolt pairs
/// on Ethernet), none able to hold a half of the model as a group of two: placement chains the pairs
/// as two groups, each running a range of layers, so that only the hidden state crosses a slow link
/// (once a token) while the sums stay within the pairs. Every rank's bytes are exact for its slice of
/// its group's layers. With every link fast, one group of four is faster and is chosen instead.
#[test]
fn nodes_in_fast_pairs_chain_two_groups_over_the_slow_link_between_them() {
    let needs = needs();
    let model = Model::open(&common::model_path()).unwrap();
    let each = needs.groups[0].slices.iter().map(|(s, w)| needs.rank(s, *w).total()).max().unwrap();
    let offer_mb = each / MB - 10;
    let rated = |name: &str| NodeOffer { weight_rate: Some(2_500 * MB), ..node(name, offer_mb) };
    let nodes = [rated("a1"), rated("b1"), rated("a2"), rated("b2")];
    // Within a pair 50 µs and 10 Gb/s; between pairs as given.
    let pairs = |rtt_us: u64, bps: u64| -> Vec<LinkCost> {
        let mut links = Vec::new();
        for i in 0..4 {
            for j in i + 1..4 {
                let same_pair = nodes[i].name[1..] == nodes[j].name[1..];
                let (rtt_us, bps) = if same_pair { (50, 10_000 * MB) } else { (rtt_us, bps) };
                links.push(link(&nodes[i], &nodes[j], rtt_us, bps));
            }
        }
        links
    };

    let plan = placement::plan_mode(&needs, &nodes, &pairs(2_000, 100 * MB), None).unwrap();
    assert_eq!(plan.parallel, placement::Parallelism::Chain, "{plan:#?}");
    let ring = plan.ring();
    assert_eq!(ring.len(), 2);
    for group in &ring {
        let names: Vec<&str> = group.iter().map(|&i| plan.stages[i].node_name.as_str()).collect();
        assert_eq!(names.len(), 2);
        assert_eq!(names[0][1..], names[1][1..], "a group is a fast pair: {names:?}");
    }
    let (first, second) = (&plan.stages[ring[0][0]].layers, &plan.stages[ring[1][0]].layers);
    assert_eq!((first.start, first.end, second.end), (0, second.start, 30), "{first:?} then {second:?}");
    for (i, s) in plan.stages.iter().enumerate() {
        let slice = s.slice.as_ref().expect("every node is a rank");
        let place = plan.rank_of(i).unwrap();
        assert_eq!((place.ring_stages, place.shares.len()), (2, 2));
        let exact = shoal::model::slice::rank_bytes_in(&model, slice, s.layers.clone()).unwrap();
        assert_eq!(s.bytes.weights, exact, "{} holds its slice of layers {:?}", s.node_name, s.layers);
        assert!(s.bytes.total() <= s.offer, "{} needs {} of {}", s.node_name, s.bytes.total(), s.offer);
    }
    let rate = plan.expected_decode_tokens_per_second.unwrap();
    let pipeline = plan.alternatives.iter().find(|a| a.parallel == placement::Parallelism::Pipeline).unwrap();
    let group = plan.alternatives.iter().find(|a| a.parallel == placement::Parallelism::Tensor).unwrap();
    assert!(rate >= 1.15 * pipeline.expected_decode_tokens_per_second.unwrap(), "{rate} against {pipeline:?}");
    assert!(rate >= 1.15 * group.expected_decode_tokens_per_second.unwrap_or(0.0), "{rate} against {group:?}");
    assert!(pipeline.reason.contains("predicted"), "{}", pipeline.reason);

    // Every link fast: the four nodes sum as one group, and the chain is the alternative.
    let fast = placement::plan_mode(&needs, &nodes, &pairs(50, 10_000 * MB), None).unwrap();
    assert_eq!(fast.parallel, placement::Parallelism::Tensor, "{fast:#?}");
    assert!(fast.alternatives.iter().any(|a| a.parallel == placement::Parallelism::Chain));

    // A chain asked for on two nodes: refused with the reason.
    let error = placement::plan_mode(&needs, &nodes[..2], &pairs(2_000, 100 * MB), Some(placement::Parallelism::Chain))
        .unwrap_err()
        .to_string();
    assert!(error.contains("at least three nodes"), "{error}");
}

/// Saved prefixes (the prompt cache beyond the slots) get the memory each stage's node offers beyond
/// the plan, up to what is asked: a roomy node keeps all, three tight ones keep what the tightest
/// stage's room holds, a tensor-parallel group and a sliding-window model none.
#[test]
fn saved_prefixes_get_the_memory_left_beyond_the_plan_up_to_what_is_asked() {
    let needs = needs();
    let per_token = needs.kv_per_position;
    assert_eq!(per_token, 30 * 2 * 192 * 2);
    let roomy = placement::plan(&needs, &[node("big", 400)], &[]).unwrap();
    assert_eq!(placement::saved_prefix_tokens(&roomy, &needs, 4096), 4096);
    let left = roomy.stages[0].offer - roomy.stages[0].bytes.total();
    assert_eq!(placement::saved_prefix_tokens(&roomy, &needs, usize::MAX), (left / per_token) as usize);

    let nodes = [node("a", 64), node("b", 64), node("c", 64)];
    let tight = placement::plan(&needs, &nodes, &[]).unwrap();
    let tokens = placement::saved_prefix_tokens(&tight, &needs, usize::MAX);
    let fits = |s: &placement::StagePlan, tokens: usize| {
        let per_stage: u64 = needs.kv_per_layer_position[s.layers.clone()].iter().sum();
        s.bytes.total() + tokens as u64 * per_stage <= s.offer
    };
    assert!(tight.stages.iter().all(|s| fits(s, tokens)), "every stage holds its rows of them: {tokens}");
    assert!(tight.stages.iter().any(|s| !fits(s, tokens + 1)), "and the tightest no more");

    let group =
        placement::plan_mode(&needs, &[node("a", 400), node("b", 400)], &[], Some(placement::Parallelism::Tensor))
            .unwrap();
    assert_eq!(placement::saved_prefix_tokens(&group, &needs, 4096), 0, "a group's ranks save no prefixes");
    let gemma = Model::open(&common::gemma3_path()).unwrap();
    let gemma_needs = ModelNeeds::of(&gemma, 256, 1, 256);
    let plan = placement::plan(&gemma_needs, &[node("big", 2_000)], &[]).unwrap();
    assert_eq!(placement::saved_prefix_tokens(&plan, &gemma_needs, 4096), 0, "a ring is not a prefix");
}
