//! Renders a conversation into a prompt with the model's own chat template (`tokenizer.chat_template`,
//! a Jinja template), using minijinja with Python-compatible string and dict methods.

use super::ModelError;
use minijinja::{context, Environment, Error, ErrorKind};
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

/// ChatML, used when a model has no template of its own.
const CHATML: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// Compiles `source` (or ChatML when the model has none). `bos`/`eos` are the texts of the model's
    /// begin and end tokens, which many templates insert.
    pub fn new(source: Option<&str>, bos: String, eos: String) -> Result<ChatTemplate, ModelError> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned("chat", source.unwrap_or(CHATML).to_string())
            .map_err(|e| ModelError::ChatTemplate(format!("the model's chat template does not compile: {e}")))?;
        Ok(ChatTemplate { env, bos, eos })
    }

    /// The prompt for `messages`, ending where the assistant's reply begins.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, ModelError> {
        self.render_any(messages, None)
    }

    /// The prompt for messages as JSON (with `tool_calls`, `tool_call_id` and the like) and the tools the
    /// model may call (OpenAI's `tools` list, which templates take as `tools`; none when empty).
    pub fn render_with_tools(
        &self,
        messages: &[serde_json::Value],
        tools: &[serde_json::Value],
    ) -> Result<String, ModelError> {
        self.render_any(messages, (!tools.is_empty()).then_some(tools))
    }

    fn render_any<M: Serialize>(
        &self,
        messages: &[M],
        tools: Option<&[serde_json::Value]>,
    ) -> Result<String, ModelError> {
        let template = self.env.get_template("chat").expect("added in new");
        template
            .render(context! {
                messages => messages,
                tools => tools,
                add_generation_prompt => true,
                bos_token => self.bos,
                eos_token => self.eos,
            })
            .map_err(|e| ModelError::ChatTemplate(format!("the model's chat template failed: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            t.render_with_tools(&messages, &tools).unwrap(),
            "[w]user:Weather?;assistant:{\"city\":\"Oslo\"};tool:sunny;"
        );
        assert_eq!(t.render_with_tools(&messages[..1], &[]).unwrap(), "user:Weather?;");
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
