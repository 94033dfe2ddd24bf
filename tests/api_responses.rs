//! OpenAI's Responses API (`POST /v1/responses`, what Codex speaks) through the official Python client,
//! against one real node serving SmolLM2 (issue 48 item 2): a greedy response gives the chat completion's
//! text for the same conversation (instructions and a string, or items), whole and streamed (Responses'
//! events, in order and numbered, whose deltas make the text); `previous_response_id` goes on from a
//! remembered response with only the new input (the prompt cache giving back the earlier turns), and a
//! remembered response is read back, its input items listed and it is deleted; a
//! required or named function tool is called with arguments that parse, whole and streamed, and its
//! output sent back is answered; a response kept with `store: false` or never made is a 404 that says
//! why, and an input item the node cannot read a 400 naming it.

mod common;

use common::cluster::{Network, TestCluster};
use serde_json::{json, Value};

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1";

#[test]
fn the_responses_api_answers_as_chat_completions_do_and_goes_on_from_a_response() {
    let mut c = TestCluster::with_network(1, Network::Loopback);
    c.form(&[]);
    let model = common::model_path();
    let args = ["run", model.to_str().unwrap(), "--context", "1024", "--sequences", "2", "--threads", "1"];
    let out = c.cli(0, &args);
    assert!(out.status.success(), "shoal run failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    let r = c.python_clients(0, "api_responses.py", MODEL);

    let text = &r["text"];
    assert_eq!(text["text"], r["chat"], "{r:#}");
    assert_eq!(r["items"]["text"], r["chat"], "items (a developer message, input_text parts) read alike: {r:#}");
    assert_eq!(text["types"], json!(["message"]), "{r:#}");
    let at_limit = text["output"] == 12;
    assert_eq!(text["status"], if at_limit { "incomplete" } else { "completed" }, "{r:#}");
    assert_eq!(text["incomplete"], if at_limit { json!("max_output_tokens") } else { Value::Null }, "{r:#}");

    let stream = &r["stream"];
    assert_eq!(stream["text"], r["chat"], "the deltas make the text: {r:#}");
    assert_eq!(stream["final"]["text"], r["chat"], "{r:#}");
    let types: Vec<&str> = stream["types"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let end = if at_limit { "response.incomplete" } else { "response.completed" };
    let expected_frame =
        ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"];
    assert_eq!(types[..4], expected_frame, "{types:?}");
    let tail = ["response.output_text.done", "response.content_part.done", "response.output_item.done", end];
    assert_eq!(types[types.len() - 4..], tail, "{types:?}");
    assert!(types[4..types.len() - 4].iter().all(|t| *t == "response.output_text.delta"), "{types:?}");
    let numbers: Vec<u64> = stream["numbers"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).collect();
    assert_eq!(numbers, (0..numbers.len() as u64).collect::<Vec<_>>(), "numbered in order");

    let next = &r["next"];
    assert_eq!(next["text"], r["next_chat"], "the remembered conversation, then the new question: {r:#}");
    assert!(next["cached"].as_u64().unwrap() > 0, "the prompt cache gave back the earlier turns: {r:#}");
    assert!(next["input"].as_u64().unwrap() > text["input"].as_u64().unwrap(), "{r:#}");

    // Read back as it was answered, its conversation listed (the earlier turn, its answer, the new
    // question), deleted once, and then gone.
    let stored = &r["stored"];
    assert_eq!((&stored["back"]["id"], &stored["back"]["text"]), (&next["id"], &next["text"]), "{r:#}");
    assert_eq!(stored["inputs"], json!(["message", "message", "message"]), "{r:#}");
    assert_eq!(stored["gone"], json!({ "retrieve": 404, "delete": 404 }), "{r:#}");

    let call = &r["call"];
    assert_eq!(call["name"], "get_weather", "{r:#}");
    assert!(call["arguments"]["city"].is_string(), "the arguments parse and follow the schema: {r:#}");
    assert!(call["types"].as_array().unwrap().contains(&json!("function_call")), "{r:#}");
    assert!(r["answered"]["text"].as_str().is_some_and(|t| !t.is_empty()), "the call's output is answered: {r:#}");
    assert!(r["call_stream"]["arguments"]["city"].is_string(), "{r:#}");
    assert_eq!(r["call_stream"]["final"], json!(["function_call"]), "{r:#}");

    let errors = &r["errors"];
    for kind in ["unkept", "unknown"] {
        assert_eq!(errors[kind]["status"], 404, "{kind}: {r:#}");
        assert!(errors[kind]["message"].as_str().unwrap().contains("send the whole conversation"), "{r:#}");
    }
    assert_eq!(errors["image"]["status"], 400, "{r:#}");
    assert!(errors["image"]["message"].as_str().unwrap().contains("input_image"), "{r:#}");
}
