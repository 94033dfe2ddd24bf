//! Worker processes wired into a ring by hand, as the agent does (`Connect` on stdin), with RDMA asked
//! for on one link: RDMA cannot start on this machine (no devices, or a build without the feature), so
//! the stage reports the fallback to TCP with the reason, and the two-stage ring still generates
//! exactly what one process does. The same for the links of a tensor-parallel group (`ConnectGroup`),
//! and for a group chained with a whole stage in a ring.

mod common;

use shoal::engine::SamplingParams;
use shoal::transport::ring::{RdmaRoute, RingTransport};
use shoal::worker::{FrontEvent, FrontRequest, PromptInput, WorkerCommand, WorkerEvent};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

const SECRET_HEX: &str = "0707070707070707070707070707070707070707070707070707070707070707";
const FRONT_TOKEN: &str = "front-token-for-the-test";

struct Worker {
    child: Child,
    stdin: ChildStdin,
    events: Receiver<WorkerEvent>,
}

impl Worker {
    fn start(layers: &str, stage: usize, stages: usize) -> Worker {
        Worker::start_with(layers, stage, stages, &[])
    }

    /// Rank `rank` of a tensor-parallel group of two equal shares.
    fn rank(rank: usize) -> Worker {
        Worker::start_with("0-29", rank, 2, &["--tensor-rank", &rank.to_string(), "--tensor-shares", "0.5,0.5"])
    }

    fn start_with(layers: &str, stage: usize, stages: usize, extra: &[&str]) -> Worker {
        let mut child = common::shoal()
            .args(["worker", "--model"])
            .arg(common::model_path())
            .args(["--layers", layers, "--stage", &stage.to_string(), "--stages", &stages.to_string()])
            .args(extra)
            .args(["--context", "256", "--sequences", "1", "--listen", "127.0.0.1"])
            .env("SHOAL_CLUSTER_SECRET", SECRET_HEX)
            .env("SHOAL_FRONT_TOKEN", FRONT_TOKEN)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting a worker");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, events) = channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if let Ok(event) = serde_json::from_str::<WorkerEvent>(&line) {
                    let _ = tx.send(event);
                }
            }
        });
        Worker { child, stdin, events }
    }

    /// The next event that `pick` takes, within a minute.
    fn wait<T>(&self, what: &str, mut pick: impl FnMut(WorkerEvent) -> Option<T>) -> T {
        loop {
            let event = self.events.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("no {what}"));
            if let WorkerEvent::Failed { error } = &event {
                panic!("the worker failed while waiting for {what}: {error}");
            }
            if let Some(t) = pick(event) {
                return t;
            }
        }
    }

    /// Waits until it listens: (data port, front port).
    fn listening(&self) -> (u16, Option<u16>) {
        self.wait("listening", |e| match e {
            WorkerEvent::Listening { data_port, front_port, .. } => Some((data_port, front_port)),
            _ => None,
        })
    }

    fn command(&mut self, command: &WorkerCommand) {
        writeln!(self.stdin, "{}", serde_json::to_string(command).unwrap()).unwrap();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Generates greedily from stage 0's front port; the text.
fn generate(front_port: u16) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", front_port)).unwrap();
    let request = FrontRequest {
        prompt: PromptInput::Text("The capital of France is".into()),
        max_tokens: 24,
        sampling: SamplingParams { temperature: 0.0, ..SamplingParams::default() },
        stop: Vec::new(),
        ignore_eos: true,
    };
    writeln!(stream, "{FRONT_TOKEN}\n{}", serde_json::to_string(&request).unwrap()).unwrap();
    let mut text = String::new();
    for line in BufReader::new(stream).lines() {
        match serde_json::from_str::<FrontEvent>(&line.unwrap()).unwrap() {
            FrontEvent::Text { text: t } => text += &t,
            FrontEvent::Done { .. } => return text,
            FrontEvent::Error { message, .. } | FrontEvent::Busy { message } => panic!("generation failed: {message}"),
            FrontEvent::TooLong { prompt_tokens, .. } => panic!("a prompt of {prompt_tokens} tokens did not fit"),
            FrontEvent::Started { .. } => {}
        }
    }
    panic!("the front connection ended before Done")
}

#[test]
fn a_link_that_cannot_start_rdma_falls_back_to_tcp_and_the_ring_generates_as_one_process() {
    let whole = Worker::start("0-29", 0, 1);
    let (_, whole_front) = whole.listening();
    whole.wait("ready", |e| matches!(e, WorkerEvent::Ready).then_some(()));
    let expected = generate(whole_front.expect("stage 0 has a front port"));
    drop(whole);

    let mut first = Worker::start("0-14", 0, 2);
    let mut second = Worker::start("15-29", 1, 2);
    let (first_data, front) = first.listening();
    let (second_data, _) = second.listening();
    let at = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let route = RdmaRoute { device: "rdma_en4".into(), peer_device: "rdma_en5".into(), slot_bytes: 4096 };
    first.command(&WorkerCommand::Connect { next: at(second_data), rdma: Some(route) });
    second.command(&WorkerCommand::Connect { next: at(first_data), rdma: None });

    let reason = first.wait("the link's transport", |e| match e {
        WorkerEvent::RingLink { transport: RingTransport::Tcp { reason } } => Some(reason),
        WorkerEvent::RingLink { transport } => panic!("RDMA cannot carry a link here, yet: {transport:?}"),
        _ => None,
    });
    assert!(reason.starts_with("RDMA could not start here"), "{reason}");
    first.wait("ready", |e| matches!(e, WorkerEvent::Ready).then_some(()));
    second.wait("ready", |e| matches!(e, WorkerEvent::Ready).then_some(()));
    assert_eq!(generate(front.unwrap()), expected);
}

#[test]
fn a_group_whose_links_cannot_start_rdma_falls_back_to_tcp_and_generates_as_one_process() {
    // The same group in one process (its sums add the parts in the same order).
    let expected = common::group_process("The capital of France is", 24, &[0.5, 0.5]);

    let mut ranks = [Worker::rank(0), Worker::rank(1)];
    let (leader_data, front) = ranks[0].listening();
    let ports = [leader_data, ranks[1].listening().0];
    let peers: Vec<SocketAddr> = ports.iter().map(|&p| SocketAddr::from(([127, 0, 0, 1], p))).collect();
    // The agent gives each rank its routes in rank order; the lower rank of a pair offers.
    let route = RdmaRoute { device: "rdma_en4".into(), peer_device: "rdma_en5".into(), slot_bytes: 4096 };
    ranks[0].command(&WorkerCommand::ConnectGroup { peers: peers.clone(), rdma: vec![None, Some(route.clone())] });
    ranks[1].command(&WorkerCommand::ConnectGroup { peers, rdma: vec![Some(route), None] });

    let (peer, reason) = ranks[0].wait("the pair's transport", |e| match e {
        WorkerEvent::GroupLink { peer, transport: RingTransport::Tcp { reason } } => Some((peer, reason)),
        WorkerEvent::GroupLink { transport, .. } => panic!("RDMA cannot carry a link here, yet: {transport:?}"),
        _ => None,
    });
    assert_eq!(peer, 1);
    assert!(reason.starts_with("RDMA could not start here"), "{reason}");
    ranks[0].wait("ready", |e| matches!(e, WorkerEvent::Ready).then_some(()));
    ranks[1].wait("ready", |e| matches!(e, WorkerEvent::Ready).then_some(()));
    assert_eq!(generate(front.expect("the leader has a front port")), expected);
}

/// A tensor-parallel group is one stage of a ring whose other stage is a whole stage: first, the
/// group's leader takes the requests, sends each step to its ranks as a lone group does and passes the
/// hidden states on, and the whole stage samples; then the whole stage takes the requests and the
/// group, from the hidden states it receives, gathers its ranks' logits and samples. Each generates
/// what the same chain generates in one process.
#[test]
fn a_group_chained_with_a_stage_in_a_ring_generates_as_one_process() {
    let halves = [(0..15, "0-14"), (15..30, "15-29")];
    for group_stage in [0, 1] {
        let stage = 1 - group_stage;
        let mut chain = vec![(halves[0].0.clone(), vec![1.0]), (halves[1].0.clone(), vec![1.0])];
        chain[group_stage].1 = vec![0.5, 0.5];
        let expected = common::chain_process("The capital of France is", 24, &chain);

        let group = |rank: usize| {
            let (rank, at) = (rank.to_string(), group_stage.to_string());
            let args =
                ["--tensor-rank", &rank, "--tensor-shares", "0.5,0.5", "--group-stage", &at, "--group-stages", "2"];
            Worker::start_with(halves[group_stage].1, rank.parse().unwrap(), 3, &args)
        };
        let mut ranks = [group(0), group(1)];
        let mut whole = Worker::start(halves[stage].1, stage, 2);
        let (leader_data, leader_front) = ranks[0].listening();
        let (whole_data, whole_front) = whole.listening();
        let peers: Vec<SocketAddr> =
            [leader_data, ranks[1].listening().0].iter().map(|&p| SocketAddr::from(([127, 0, 0, 1], p))).collect();
        for rank in &mut ranks {
            rank.command(&WorkerCommand::ConnectGroup { peers: peers.clone(), rdma: vec![None, None] });
        }
        // The leader's data port is the group's until its ranks have linked: the ring connects after.
        ranks[1].wait("the follower linked", |e| matches!(e, WorkerEvent::Ready).then_some(()));
        let at = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        whole.command(&WorkerCommand::Connect { next: at(leader_data), rdma: None });
        ranks[0].command(&WorkerCommand::Connect { next: at(whole_data), rdma: None });
        ranks[0].wait("ready", |e| matches!(e, WorkerEvent::Ready).then_some(()));
        whole.wait("ready", |e| matches!(e, WorkerEvent::Ready).then_some(()));
        let front = if group_stage == 0 { leader_front } else { whole_front };
        assert_eq!(
            generate(front.expect("the first stage takes requests")),
            expected,
            "the group at stage {group_stage}"
        );
    }
}
