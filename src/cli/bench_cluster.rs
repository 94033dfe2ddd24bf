//! `shoal bench --cluster`: what users of a running instance see, measured through the node's API as
//! llama-bench measures a model: prefill (ppN: a prompt of N random tokens, one token generated) with
//! its time to first token, decode from an empty context (tgM: one prompt token, M generated, greedy,
//! end-of-text ignored) and decode after a prompt of N tokens (tgM @ dN), each the median over the
//! repetitions after one warm-up round. With `--concurrency C`, the decode test runs C requests at once
//! and reports their aggregate rate (all their tokens over the time from the first request sent to the
//! last answer) beside each one's own rate, and its ratio to one request's rate counted the same way.

use super::BenchArgs;
use shoal::engine::bench::median;
use shoal::instances::{InstanceInfo, InstanceState};
use shoal::worker::GenerationReport;
use std::time::Instant;

#[derive(serde::Serialize)]
struct ClusterReport {
    model: String,
    stages: usize,
    prompt_tokens: usize,
    gen_tokens: usize,
    repetitions: usize,
    concurrency: usize,
    prefill_tokens_per_second: f64,
    time_to_first_token_ms: f64,
    /// One request decoding from an empty context.
    decode_tokens_per_second: f64,
    /// One request decoding after a prompt of `prompt_tokens`.
    deep_decode_tokens_per_second: f64,
    /// `concurrency` requests decoding at once: all their tokens per second, and each one's median.
    concurrent_decode_tokens_per_second: f64,
    concurrent_per_request_tokens_per_second: f64,
    /// The aggregate against one request's, both counted alike (tokens over wall time).
    concurrent_ratio: f64,
    /// Median per-hop link time of a decode step (µs), for multi-stage instances.
    hop_p50_us: Option<u64>,
    /// How the instance is split (pipeline or tensor).
    parallel: shoal::placement::Parallelism,
    /// A tensor-parallel instance: the median time of one sum across its group (µs), as its leader
    /// reports it after the runs.
    allreduce_p50_us: Option<u64>,
    /// The decode rate placement predicted for this instance when it was planned.
    expected_decode_tokens_per_second: Option<f64>,
    /// What that prediction is made of: a token's time computing (the stages' step times, or a group's
    /// slowest rank's) and on the links, as planned (µs).
    planned_compute_us: Option<u64>,
    planned_link_us: u64,
}

/// One round of `concurrency` requests at once: each one's report, and their tokens over the round's
/// wall time.
fn round(args: &BenchArgs, bodies: Vec<serde_json::Value>) -> anyhow::Result<(Vec<GenerationReport>, f64)> {
    let started = Instant::now();
    let answers: Vec<anyhow::Result<serde_json::Value>> = std::thread::scope(|scope| {
        let handles: Vec<_> =
            bodies.into_iter().map(|body| scope.spawn(|| args.node.post("/v1/completions", body))).collect();
        handles.into_iter().map(|h| h.join().expect("a request thread does not panic")).collect()
    });
    let elapsed = started.elapsed();
    let mut reports = Vec::new();
    for answer in answers {
        reports.push(serde_json::from_value::<GenerationReport>(answer?["shoal"].clone())?);
    }
    let tokens: usize = reports.iter().map(|r| r.generated_tokens).sum();
    Ok((reports, shoal::engine::rate(tokens, elapsed)))
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    use rand::{Rng, SeedableRng};
    let instances: Vec<InstanceInfo> = args.node.get("/api/instances")?;
    let instance = instances
        .into_iter()
        .filter(|i| i.state == InstanceState::Ready)
        .find(|i| args.name.as_ref().is_none_or(|n| *n == i.model || *n == i.id))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no ready instance{}; start one with `shoal run`",
                args.name.as_ref().map(|n| format!(" called {n}")).unwrap_or_default()
            )
        })?;
    if args.prompt_tokens + args.gen_tokens >= instance.context {
        anyhow::bail!(
            "the instance's context ({}) is too small for {} + {} tokens; launch with a larger --context",
            instance.context,
            args.prompt_tokens,
            args.gen_tokens
        );
    }
    let concurrency = args.concurrency.max(1);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    let vocabulary = instance.plan.vocabulary as u32;
    let mut prompt = |n: usize| -> Vec<u32> { (0..n.max(1)).map(|_| rng.random_range(0..vocabulary)).collect() };
    let body = |prompt: Vec<u32>, max_tokens: usize| {
        serde_json::json!({
            "model": instance.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true,
        })
    };
    let (mut prefill, mut decode, mut deep, mut concurrent, mut each) = (vec![], vec![], vec![], vec![], vec![]);
    let mut single_wall = Vec::new();
    let mut hops = Vec::new();
    for repetition in 0..=args.repetitions.max(1) {
        let (pp, _) = round(args, vec![body(prompt(args.prompt_tokens), 1)])?;
        let (tg, tg_wall) = round(args, vec![body(prompt(1), args.gen_tokens)])?;
        let (tg_deep, _) = round(args, vec![body(prompt(args.prompt_tokens), args.gen_tokens)])?;
        let (together, aggregate) = if concurrency > 1 {
            round(args, (0..concurrency).map(|_| body(prompt(1), args.gen_tokens)).collect())?
        } else {
            (vec![], 0.0)
        };
        if repetition == 0 {
            continue;
        }
        prefill.push((pp[0].prefill_tokens_per_second, pp[0].time_to_first_token_ms));
        decode.push(tg[0].decode_tokens_per_second);
        single_wall.push(tg_wall);
        deep.push(tg_deep[0].decode_tokens_per_second);
        hops.extend(tg[0].hop_p50_us.map(|h| h as f64));
        if concurrency > 1 {
            concurrent.push(aggregate);
            each.push(median(&together.iter().map(|r| r.decode_tokens_per_second).collect::<Vec<_>>()));
        }
    }
    let report = ClusterReport {
        model: instance.model.clone(),
        stages: instance.stages.len(),
        prompt_tokens: args.prompt_tokens,
        gen_tokens: args.gen_tokens,
        repetitions: decode.len(),
        concurrency,
        prefill_tokens_per_second: median(&prefill.iter().map(|p| p.0).collect::<Vec<_>>()),
        time_to_first_token_ms: median(&prefill.iter().map(|p| p.1).collect::<Vec<_>>()),
        decode_tokens_per_second: median(&decode),
        deep_decode_tokens_per_second: median(&deep),
        concurrent_decode_tokens_per_second: median(&concurrent),
        concurrent_per_request_tokens_per_second: median(&each),
        concurrent_ratio: if concurrency > 1 { median(&concurrent) / median(&single_wall) } else { 1.0 },
        hop_p50_us: (!hops.is_empty()).then(|| median(&hops) as u64),
        parallel: instance.plan.parallel,
        allreduce_p50_us: allreduce_p50(args, &instance.id),
        expected_decode_tokens_per_second: instance.plan.expected_decode_tokens_per_second,
        planned_compute_us: planned_compute_us(&instance.plan),
        planned_link_us: instance.plan.ring_us,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "model      {} on {} stage(s) ({}), through the cluster API",
        report.model, report.stages, report.parallel
    );
    let (pp, tg) = (report.prompt_tokens, report.gen_tokens);
    println!("pp{pp:<8} {:>8.1} tok/s  (median of {})", report.prefill_tokens_per_second, report.repetitions);
    println!("ttft       {:>8.1} ms    (pp{pp})", report.time_to_first_token_ms);
    println!("tg{tg:<8} {:>8.1} tok/s  (from an empty context)", report.decode_tokens_per_second);
    println!("tg{:<8} {:>8.1} tok/s", format!("{tg} @ d{pp}"), report.deep_decode_tokens_per_second);
    if concurrency > 1 {
        println!(
            "tg{tg:<8} {:>8.1} tok/s  in all, {concurrency} requests at once ({:.2}x one), {:.1} tok/s each",
            report.concurrent_decode_tokens_per_second,
            report.concurrent_ratio,
            report.concurrent_per_request_tokens_per_second
        );
    }
    if let Some(h) = report.hop_p50_us {
        println!("hop p50    {h:>8} µs per link per decode step");
    }
    if let Some(predicted) = report.expected_decode_tokens_per_second {
        println!(
            "predicted  {predicted:>8.1} tok/s  decode, as placement planned it ({:.2}x the measured tg{tg}; \
             per token {} µs computing, {} µs on links)",
            predicted / report.decode_tokens_per_second,
            report.planned_compute_us.map_or("?".to_string(), |us| us.to_string()),
            report.planned_link_us
        );
    }
    if let Some(sum) = report.allreduce_p50_us {
        println!("sum p50    {sum:>8} µs per sum across the tensor-parallel group (two per layer)");
    }
    Ok(())
}

/// A token's planned time computing: the predicted step less its time on links (the stages' step times
/// one after another, or what a tensor-parallel group's layers wait for: its busiest rank's).
fn planned_compute_us(plan: &shoal::placement::Plan) -> Option<u64> {
    let step_us = 1e6 / plan.expected_decode_tokens_per_second?;
    Some((step_us.round() as u64).saturating_sub(plan.ring_us))
}

/// The median sum time the first group's leader reports (its stats come each second: wait for the ones
/// after the runs).
fn allreduce_p50(args: &BenchArgs, id: &str) -> Option<u64> {
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let info: InstanceInfo = args.node.get(&format!("/api/instances/{id}")).ok()?;
    info.stages.iter().find_map(|s| s.stats.as_ref()?.allreduce_p50_us)
}
