//! Structured output. With SmolLM2's real vocabulary and random logits (no model could be more
//! careless), the constrained sampler still only writes JSON that its schema accepts, and always ends;
//! under lazily constrained tool calls, each call it opens parses and names an offered tool.
//! Through the official clients against two real nodes serving SmolLM2 split in two stages (so the
//! stage that samples is not the one that took the request), every reply to OpenAI's `json_schema`,
//! Ollama's `format` and Anthropic's `output_format` validates with pydantic; a single-stage instance
//! constrains too; a schema that cannot be used is refused with a 400 naming `response_format`.

mod common;

use common::cluster::{Network, TestCluster};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use shoal::engine::{CallStyle, CallableTool, Grammars, OutputFormat, Sampler, SamplingParams};
use shoal::model::{Model, Tokenizer};

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1";

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "age", "tags", "ok"],
        "additionalProperties": false
    })
}

/// Whether `value` is what `person_schema` allows (checked by hand, independently of llguidance).
fn is_person(value: &Value) -> Result<(), String> {
    let object = value.as_object().ok_or("not an object")?;
    let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
    keys.sort_unstable();
    if keys != ["age", "name", "ok", "tags"] {
        return Err(format!("keys {keys:?}"));
    }
    let name = object["name"].as_str().ok_or("name is not a string")?;
    if name.chars().count() > 12 {
        return Err(format!("name {name:?} is longer than 12"));
    }
    let age = object["age"].as_i64().ok_or("age is not an integer")?;
    if !(0..=120).contains(&age) {
        return Err(format!("age {age}"));
    }
    let tags = object["tags"].as_array().ok_or("tags is not an array")?;
    if tags.len() > 3 || tags.iter().any(|t| t.as_str().is_none_or(|t| t.chars().count() > 6)) {
        return Err(format!("tags {tags:?}"));
    }
    object["ok"].as_bool().ok_or("ok is not a boolean")?;
    Ok(())
}

#[test]
fn random_logits_under_a_schema_give_json_that_the_schema_accepts() {
    let model = Model::open(&common::model_path()).unwrap();
    let tokenizer = model.tokenizer().unwrap();
    let mut grammars = Grammars::new(model.tokenizer().unwrap());
    let format = OutputFormat::JsonSchema { schema: person_schema() };
    let vocabulary = tokenizer.vocabulary_size();
    let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..SamplingParams::default() };
    for seed in 0..20u64 {
        let mut sampler = Sampler::new(SamplingParams { seed, ..params.clone() });
        sampler.constrain(grammars.constraint(&format).unwrap());
        let mut noise = rand_chacha::ChaCha8Rng::seed_from_u64(1000 + seed);
        let mut tokens = Vec::new();
        let ended = loop {
            let logits: Vec<f32> = (0..vocabulary).map(|_| noise.random_range(-4.0..4.0)).collect();
            let token = sampler.sample(&logits);
            if tokenizer.is_end_of_generation(token) {
                break true;
            }
            tokens.push(token);
            if tokens.len() > 400 {
                break false;
            }
        };
        let text = tokenizer.decode(&tokens);
        assert!(ended, "seed {seed}: no end after 400 tokens: {text}");
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
        is_person(&value).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
    }
}

/// Samples random logits under `format` (lazily constrained tool calls), steered through
/// `steer` (each of its tokens made the likeliest in turn: the constraint still masks those it does not
/// allow), then free; a few tokens after the call closes, steered to end. The reply's text.
fn sample_calls(
    grammars: &mut Grammars,
    tokenizer: &Tokenizer,
    format: OutputFormat,
    steer: &str,
    seed: u64,
) -> String {
    format.check().unwrap();
    let vocabulary = tokenizer.vocabulary_size();
    let eos = (0..vocabulary as u32).find(|&t| tokenizer.is_end_of_generation(t)).unwrap();
    let steer = tokenizer.encode_plain(steer).unwrap();
    let params =
        SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed, ..SamplingParams::default() };
    let mut sampler = Sampler::new(params);
    sampler.constrain(grammars.constraint(&format).unwrap());
    let mut noise = rand_chacha::ChaCha8Rng::seed_from_u64(2000 + seed);
    let mut tokens: Vec<u32> = Vec::new();
    let mut after_call = 0;
    loop {
        let mut logits: Vec<f32> = (0..vocabulary).map(|_| noise.random_range(-4.0..4.0)).collect();
        if let Some(&next) = steer.get(tokens.len()) {
            logits[next as usize] = 100.0;
        } else if tokenizer.decode(&tokens).contains("</tool_call>") {
            after_call += 1;
            if after_call > 3 {
                logits[eos as usize] = 100.0;
            }
        } else {
            // Inside the call nothing may end the reply, however likely.
            logits[eos as usize] = 100.0;
        }
        let token = sampler.sample(&logits);
        if tokenizer.is_end_of_generation(token) {
            return tokenizer.decode(&tokens);
        }
        tokens.push(token);
        assert!(tokens.len() < 600, "seed {seed}: no end after 600 tokens: {}", tokenizer.decode(&tokens));
    }
}

/// The call inside a reply `Let me look.<tool_call>…</tool_call>…`, and what follows it.
fn the_call(text: &str) -> (&str, &str) {
    let (before, rest) = text.split_once("<tool_call>").unwrap_or_else(|| panic!("{text}"));
    assert_eq!(before, "Let me look.", "free text before the call: {text}");
    let (inside, after) = rest.split_once("</tool_call>").unwrap_or_else(|| panic!("unclosed: {text}"));
    assert!(after.chars().count() <= 3 * 16, "{after:?}");
    (inside, after)
}

/// `person` (the schema above) and `clock` (no parameters).
fn json_tools() -> Vec<CallableTool> {
    vec![
        CallableTool { name: "person".into(), parameters: person_schema() },
        CallableTool {
            name: "clock".into(),
            parameters: json!({ "type": "object", "properties": {}, "additionalProperties": false }),
        },
    ]
}

/// A reply that may call tools (`tool_choice: auto`) in the JSON style (Hermes, Qwen 2.5 and 3): with
/// random logits the text is free until it opens a call (steered there), then the call is a JSON object
/// naming an offered tool with arguments its parameters accept, then `</tool_call>`; then free again —
/// or, with one call only (`parallel_tool_calls: false`), the end.
#[test]
fn random_logits_under_lazy_json_tool_calls_open_only_calls_that_parse() {
    let model = Model::open(&common::model_path()).unwrap();
    let tokenizer = model.tokenizer().unwrap();
    let mut grammars = Grammars::new(model.tokenizer().unwrap());
    for seed in 0..10u64 {
        let single = seed % 2 == 1;
        let format = OutputFormat::ToolCalls { tools: json_tools(), style: CallStyle::Json, single };
        let text = sample_calls(&mut grammars, &tokenizer, format, "Let me look.<tool_call>", seed);
        let (inside, after) = the_call(&text);
        if single {
            assert_eq!(after, "", "seed {seed}: one call, then the end: {text}");
        }
        let call: Value =
            serde_json::from_str(inside.trim_matches('\n')).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
        match call["name"].as_str() {
            Some("person") => is_person(&call["arguments"]).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}")),
            Some("clock") => assert_eq!(call["arguments"], json!({}), "seed {seed}: {text}"),
            _ => panic!("seed {seed}: not an offered tool: {text}"),
        }
    }
}

/// The same in Qwen3.5's style: `<function=NAME>`, a `<parameter=KEY>` block per argument (every
/// required one, in the schema's order, anything but a string as JSON), `</function>`. Random logits
/// would never end a string, which is free text up to `</parameter>`: the random calls take numbers,
/// booleans, enumerations and lists, and a steered call shows a string of two lines accepted.
#[test]
fn random_logits_under_lazy_function_calls_open_only_calls_that_parse() {
    let model = Model::open(&common::model_path()).unwrap();
    let tokenizer = model.tokenizer().unwrap();
    let mut grammars = Grammars::new(model.tokenizer().unwrap());
    let settings = json!({ "type": "object", "required": ["age", "unit"], "properties": {
        "age": { "type": "integer", "minimum": 0, "maximum": 120 },
        "ok": { "type": "boolean" },
        "tags": { "type": "array", "items": { "type": "integer" }, "maxItems": 3 },
        "unit": { "enum": ["c", "f"] },
    } });
    let note = json!({ "type": "object", "required": ["text"], "properties": { "text": { "type": "string" } } });
    let tools = vec![
        CallableTool { name: "settings".into(), parameters: settings },
        CallableTool { name: "note".into(), parameters: note },
    ];
    for seed in 0..10u64 {
        let steer = "Let me look.<tool_call>\n<function=settings";
        let format = OutputFormat::ToolCalls { tools: tools.clone(), style: CallStyle::XmlFunctions, single: false };
        let text = sample_calls(&mut grammars, &tokenizer, format, steer, seed);
        let body = the_call(&text).0.strip_prefix("\n<function=settings>\n").unwrap_or_else(|| panic!("{text}"));
        let mut keys = Vec::new();
        let mut rest = body;
        while let Some(block) = rest.strip_prefix("<parameter=") {
            let (key, block) = block.split_once(">\n").unwrap_or_else(|| panic!("{text}"));
            let (value, after) = block.split_once("\n</parameter>\n").unwrap_or_else(|| panic!("{text}"));
            let value: Value = match key {
                "unit" => json!(value),
                _ => serde_json::from_str(value).unwrap_or_else(|e| panic!("seed {seed} {key}: {e}: {text}")),
            };
            match key {
                "age" => {
                    assert!(value.as_f64().is_some_and(|a| a.fract() == 0.0 && (0.0..=120.0).contains(&a)), "{text}")
                }
                "ok" => assert!(value.is_boolean(), "{text}"),
                "tags" => {
                    // JSON's integers include -0, which serde reads as a float.
                    let whole = |n: &Value| n.as_f64().is_some_and(|f| f.fract() == 0.0);
                    assert!(value.as_array().is_some_and(|t| t.len() <= 3 && t.iter().all(whole)), "{text}")
                }
                "unit" => assert!(value == "c" || value == "f", "{text}"),
                other => panic!("seed {seed}: no parameter {other}: {text}"),
            }
            keys.push(key);
            rest = after;
        }
        assert_eq!(rest, "</function>\n", "seed {seed}: {text}");
        assert!(keys.contains(&"age") && keys.contains(&"unit"), "seed {seed}: the required ones: {text}");
        let order = ["age", "ok", "tags", "unit"];
        assert!(keys.is_sorted_by_key(|k| order.iter().position(|o| o == k)), "seed {seed}: in order: {text}");
    }
    let call = "Let me look.<tool_call>\n<function=note>\n<parameter=text>\nTwo\nlines\n</parameter>\n</function>\n</tool_call>";
    let format = OutputFormat::ToolCalls { tools, style: CallStyle::XmlFunctions, single: false };
    let text = sample_calls(&mut grammars, &tokenizer, format, call, 0);
    assert!(text.starts_with(call), "a string of two lines is accepted as it is: {text}");
}

/// The reply's text of a whole OpenAI chat completion.
fn chat(c: &TestCluster, body: Value) -> (u16, Value) {
    let url = format!("http://127.0.0.1:{}/v1/chat/completions", c.nodes[0].api_port);
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut response = agent.post(&url).send_json(body).expect("the API answers");
    (response.status().as_u16(), response.body_mut().read_json().unwrap())
}

#[test]
fn official_clients_get_replies_that_validate_from_a_split_model() {
    let _one_at_a_time = common::cluster::exclusive();
    let mut c = TestCluster::with_network(2, Network::Loopback);
    c.form(&[]);
    let model = common::model_path();
    let model = model.to_str().unwrap();
    let split = ["run", model, "--context", "512", "--sequences", "2", "--threads", "1"];
    let out = c.cli(0, &[&split[..], &["--layers", "node0:0-14,node1:15-29"]].concat());
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());

    let r = c.python_clients(0, "structured_output.py", MODEL);
    let replies = r["openai"].as_array().unwrap();
    assert_eq!(replies.len(), 20);
    for (i, reply) in replies.iter().enumerate() {
        assert_eq!(reply["ok"], true, "prompt {i} does not validate: {reply:#}");
        assert_eq!(reply["finish"], "stop", "prompt {i} was cut: {reply:#}");
    }
    let distinct: std::collections::BTreeSet<String> = replies.iter().map(|r| r["value"].to_string()).collect();
    assert!(distinct.len() > 1, "20 sampled replies are all the same: the seeds were not used: {distinct:?}");
    for key in ["openai_stream", "ollama_schema", "anthropic"] {
        assert_eq!(r[key]["ok"], true, "{key}: {:#}", r[key]);
    }
    assert!(r["openai_stream"]["pieces"].as_u64().unwrap() > 3, "the stream came whole: {:#}", r["openai_stream"]);
    for (key, field) in [("openai_json_object", "text"), ("ollama_json", "text")] {
        let text = r[key][field].as_str().unwrap();
        let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{key}: {e}: {text}"));
        assert!(value.is_object(), "{key}: {text}");
    }
    assert_eq!(r["bad_schema"]["status"], 400, "{:#}", r["bad_schema"]);
    assert!(r["bad_schema"]["body"].to_string().contains("\"response_format\""), "{:#}", r["bad_schema"]);
    assert!(r["bad_schema"]["error"].as_str().unwrap().contains("no-such-type"), "{:#}", r["bad_schema"]);

    // A single-stage instance samples where the request arrives.
    let whole = ["run", model, "--context", "512", "--sequences", "1", "--threads", "1", "--name", "whole"];
    let out = c.cli(0, &[&whole[..], &["--layers", "node0:0-29"]].concat());
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    let schema = json!({"type": "json_schema", "json_schema": {"name": "person", "schema": person_schema()}});
    let (status, body) = chat(
        &c,
        json!({"model": "whole", "messages": [{"role": "user", "content": "Describe a cat as JSON."}],
               "response_format": schema, "max_tokens": 120, "temperature": 0}),
    );
    assert_eq!(status, 200, "{body:#}");
    let text = body["choices"][0]["message"]["content"].as_str().unwrap();
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    is_person(&value).unwrap_or_else(|e| panic!("{e}: {text}"));
    let (status, body) = chat(
        &c,
        json!({"model": "whole", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
               "response_format": {"type": "xml"}}),
    );
    assert_eq!(status, 400, "{body:#}");
    assert_eq!(body["error"]["param"], "response_format", "{body:#}");
}
