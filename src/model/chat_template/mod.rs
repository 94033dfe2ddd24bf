//! Renders a conversation into a prompt with the model's own chat template (`tokenizer.chat_template`,
//! a Jinja template) as Hugging Face's `apply_chat_template` renders it: minijinja with Python-compatible
//! string and dict methods, blocks trimmed as Hugging Face trims them, its `tojson` and `strftime_now`
//! (see [`python`]), and the template's own variables (`reasoning_effort`, `enable_thinking`, …) when a
//! request sets them. It also says how the model's reply is laid out ([`ReplyFormat`]), which the
//! template shows: gpt-oss's harmony channels, or reasoning between `<think>` tags.

mod python;

use super::ModelError;
use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

/// How a model lays out its reply, which decides how the APIs split it into reasoning, content and
/// tool calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplyFormat {
    /// Text as it comes (tool calls may be in it: see the API's tool parsing).
    #[default]
    Plain,
    /// gpt-oss's harmony messages: `<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…`.
    Harmony,
    /// Reasoning between `<think>` and `</think>` before the answer (Qwen3, DeepSeek R1/V3.1, GLM-4.5,
    /// Kimi K2 Thinking; MiniMax M3's `<mm:think>`, as `tags` says); `open` when the prompt itself ends
    /// inside the block, so the reply starts reasoning.
    Thinking {
        open: bool,
        #[serde(default)]
        tags: ThinkTags,
    },
}

/// The markers a reasoning block is written between.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ThinkTags {
    /// `<think>` … `</think>`.
    #[default]
    Think,
    /// MiniMax M3's `<mm:think>` … `</mm:think>`.
    MiniMax,
}

impl ThinkTags {
    /// The opening and closing markers.
    pub fn markers(self) -> (&'static str, &'static str) {
        match self {
            ThinkTags::Think => ("<think>", "</think>"),
            ThinkTags::MiniMax => ("<mm:think>", "</mm:think>"),
        }
    }
}

/// ChatML, used when a model has no template of its own.
const CHATML: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Instructions one rendering may execute (minijinja's fuel). A conversation of thousands of messages
/// with tools takes far fewer; a template whose loops run away stops here with an error instead of
/// holding the worker, and one that cannot render a short conversation within it is refused.
const RENDER_FUEL: u64 = 50_000_000;

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    format: Shape,
    /// Whether the template uses the `tools` it is given.
    takes_tools: bool,
    calls: CallFormat,
}

/// How the template shows the model's tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallFormat {
    /// `<tool_call>` blocks holding `{"name": …, "arguments": {…}}` (Hermes, Qwen 2.5 and 3).
    HermesJson,
    /// `<tool_call>` blocks holding `<function=NAME>` and `<parameter=…>` lines (Qwen3-Coder, Qwen3.5).
    XmlFunctions,
    /// Another format, or none.
    Other,
}

/// What the template's source says of the replies it asks for.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    Plain,
    Harmony,
    Thinking(ThinkTags),
}

impl ChatTemplate {
    /// Compiles `source` (or ChatML when the model has none). `bos`/`eos` are the texts of the model's
    /// begin and end tokens, which many templates insert.
    pub fn new(source: Option<&str>, bos: String, eos: String) -> Result<ChatTemplate, ModelError> {
        Self::build(source, bos, eos, None)
    }

    /// As [`ChatTemplate::new`], with `strftime_now` fixed at `now_ms` (for tests).
    pub fn at_time(source: Option<&str>, bos: String, eos: String, now_ms: u64) -> Result<ChatTemplate, ModelError> {
        Self::build(source, bos, eos, Some(now_ms))
    }

    fn build(source: Option<&str>, bos: String, eos: String, now_ms: Option<u64>) -> Result<ChatTemplate, ModelError> {
        let mut env = Environment::new();
        env.set_fuel(Some(RENDER_FUEL));
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // Hugging Face renders templates with both on, and templates are written for it.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_filter("tojson", python::tojson);
        env.add_function("strftime_now", move |format: String| {
            python::strftime(&format, now_ms.unwrap_or_else(crate::util::now_ms))
        });
        env.add_function("raise_exception", |message: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        let source = source.unwrap_or(CHATML);
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| ModelError::ChatTemplate(format!("the model's chat template does not compile: {e}")))?;
        let format = if source.contains("<|channel|>") {
            Shape::Harmony
        } else if source.contains("</think>") {
            Shape::Thinking(ThinkTags::Think)
        } else if source.contains("</mm:think>") {
            Shape::Thinking(ThinkTags::MiniMax)
        } else {
            Shape::Plain
        };
        let takes_tools = env.get_template("chat").is_ok_and(|t| t.undeclared_variables(false).contains("tools"));
        // Templates that write calls as XML inside `<tool_call>` (GLM's `<arg_key>`, MiniMax's `<invoke>`)
        // say so; the rest that show `<tool_call>` write JSON in it.
        let xml = ["<arg_key>", "<invoke", "<parameter"].iter().any(|marker| source.contains(marker));
        let calls = if source.contains("<function=") {
            CallFormat::XmlFunctions
        } else if source.contains("<tool_call>") && !xml {
            CallFormat::HermesJson
        } else {
            CallFormat::Other
        };
        let template = ChatTemplate { env, bos, eos, format, takes_tools, calls };
        template.check_it_finishes()?;
        Ok(template)
    }

    /// Refuses a template that does not finish rendering a short conversation within its fuel (other
    /// errors are the conversation's: a template may refuse a role, say).
    fn check_it_finishes(&self) -> Result<(), ModelError> {
        let probe = ["system", "user", "assistant", "user"].map(|role| ChatMessage::new(role, "Hello."));
        let template = self.env.get_template("chat").expect("added in build");
        let context =
            context! { messages => probe, add_generation_prompt => true, bos_token => self.bos, eos_token => self.eos };
        match template.render(context) {
            Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(ModelError::ChatTemplate(format!(
                "the model's chat template does not finish rendering a conversation of four short messages (it ran \
                 past {RENDER_FUEL} steps); use a GGUF with a working template"
            ))),
            _ => Ok(()),
        }
    }

    /// The prompt for `messages`, ending where the assistant's reply begins.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, ModelError> {
        self.render_any(messages, None, &serde_json::Map::new())
    }

    /// The prompt for messages as JSON (with `tool_calls`, `tool_call_id`, `thinking` and the like), the
    /// tools the model may call (OpenAI's `tools` list, which templates take as `tools`; none when
    /// empty) and the template's own variables a request sets (`reasoning_effort`, `enable_thinking`).
    pub fn render_conversation(
        &self,
        messages: &[serde_json::Value],
        tools: &[serde_json::Value],
        variables: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ModelError> {
        self.render_any(messages, (!tools.is_empty()).then_some(tools), variables)
    }

    /// What a model with this template can do, as Ollama's `capabilities` name it: `completion`, `tools`
    /// when the template renders the tools a request offers, `thinking` when replies reason first.
    pub fn capabilities(&self) -> Vec<&'static str> {
        let mut capabilities = vec!["completion"];
        if self.takes_tools {
            capabilities.push("tools");
        }
        if self.format != Shape::Plain {
            capabilities.push("thinking");
        }
        capabilities
    }

    /// How the template shows the model's tool calls.
    pub fn call_format(&self) -> CallFormat {
        self.calls
    }

    /// How the reply to `prompt` (rendered by this template) is laid out.
    pub fn reply_format(&self, prompt: &str) -> ReplyFormat {
        match self.format {
            Shape::Plain => ReplyFormat::Plain,
            Shape::Harmony => ReplyFormat::Harmony,
            Shape::Thinking(tags) => {
                ReplyFormat::Thinking { open: prompt.trim_end().ends_with(tags.markers().0), tags }
            }
        }
    }

    fn render_any<M: Serialize>(
        &self,
        messages: &[M],
        tools: Option<&[serde_json::Value]>,
        variables: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ModelError> {
        let template = self.env.get_template("chat").expect("added in new");
        let fixed = context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => true,
            bos_token => self.bos,
            eos_token => self.eos,
        };
        // The request's variables first: the conversation itself cannot be overridden.
        template
            .render(context! { ..fixed, ..Value::from_serialize(variables) })
            .map_err(|e| ModelError::ChatTemplate(format!("the model's chat template failed: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_that_runs_away_is_refused() {
        let nested = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let err = ChatTemplate::new(Some(nested), String::new(), String::new()).err().expect("refused").to_string();
        assert!(err.contains("does not finish rendering"), "{err}");
        let picky = "{% if messages[0].role == 'system' %}{{ raise_exception('no system role') }}{% endif %}ok";
        assert!(ChatTemplate::new(Some(picky), String::new(), String::new()).is_ok(), "other errors are a request's");
    }

    #[test]
    fn chatml_fallback_renders_a_generation_prompt() {
        let t = ChatTemplate::new(None, String::new(), String::new()).unwrap();
        let prompt = t.render(&[ChatMessage::new("user", "Hi")]).unwrap();
        assert_eq!(prompt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn tools_and_tool_calls_reach_the_template() {
        let src = "{% if tools %}{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% endif %}{% for m in messages %}{{ m.role }}:{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}{% else %}{{ m.content }}{% endif %};{% endfor %}";
        let t = ChatTemplate::new(Some(src), String::new(), String::new()).unwrap();
        let messages = [
            serde_json::json!({ "role": "user", "content": "Weather?" }),
            serde_json::json!({ "role": "assistant", "content": "", "tool_calls": [{ "type": "function", "function": { "name": "w", "arguments": { "city": "Oslo" } } }] }),
            serde_json::json!({ "role": "tool", "content": "sunny", "tool_call_id": "call_1" }),
        ];
        let tools = [serde_json::json!({ "type": "function", "function": { "name": "w", "parameters": {} } })];
        let none = serde_json::Map::new();
        assert_eq!(
            t.render_conversation(&messages, &tools, &none).unwrap(),
            "[w]user:Weather?;assistant:{\"city\": \"Oslo\"};tool:sunny;"
        );
        assert_eq!(t.render_conversation(&messages[..1], &[], &none).unwrap(), "user:Weather?;");
    }

    #[test]
    fn python_style_methods_and_raise_exception_work() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}{{ bos_token }}{{ messages[0].content.strip() }}";
        let t = ChatTemplate::new(Some(src), "<s>".into(), "</s>".into()).unwrap();
        assert_eq!(t.render(&[ChatMessage::new("user", "  hi  ")]).unwrap(), "<s>hi");
        let err = t.render(&[ChatMessage::new("system", "x")]).unwrap_err().to_string();
        assert!(err.contains("first must be user"), "{err}");
    }
}
