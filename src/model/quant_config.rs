//! `config.json → quantization_config`: which linear layers are packed, and how.
//!
//! Read (`shared/docs/qwen3_5.md` §2.4, §4):
//! - `quant_method: "compressed-tensors"` with `format` (top level or per group)
//!   `pack-quantized` (4-bit `type: int`, `strategy: group | channel`, `group_size` 32 / 64 / 128
//!   / any divisor of K, `symmetric` true or false, `actorder` null / `weight` / `static` (no
//!   format change) or legacy `group` / `dynamic` (a `weight_g_idx` tensor)) or
//!   `nvfp4-pack-quantized` (`type: float`, 4 bits, `strategy: tensor_group`, group 16: NVFP4A16,
//!   or NVFP4 W4A4 whose activation quantization kiln does not apply; see
//!   [`SchemeTemplate::CtNvfp4`]). `config_groups.*.targets` and `ignore` entries are exact module
//!   names, `re:` regular expressions matched from the start of the name (Python's `re.match`),
//!   or class names: every module kiln asks about is a `Linear`.
//! - `quant_method: "awq"` (`version: gemm`, `bits: 4`, `zero_point: true`, `group_size`,
//!   `modules_to_not_convert`: substrings of module names, as AutoAWQ matches them).
//! - `quant_method: "gptq"` (`bits: 4`, `group_size` (−1 = per channel), `desc_act`, `sym`,
//!   `checkpoint_format` `gptq` (zeros stored minus one) or `gptq_v2`, `lm_head`,
//!   `modules_to_not_convert`).
//!
//! A module is decided when the loader asks for it ([`QuantConfig::decide`]): ignored and
//! untargeted modules stay dense (their 16-bit `.weight`); a module whose scheme kiln cannot run
//! is `ModelError::Unsupported` naming the module and the scheme, so a checkpoint with one odd
//! group still loads when that group's modules are never asked for.

use regex::Regex;
use serde_json::Value;

use crate::error::ModelError;

/// One entry of `targets` / `ignore`.
#[derive(Debug, Clone)]
enum ModuleMatcher {
    /// The whole module name.
    Exact(String),
    /// `re:` pattern, anchored at the start.
    Regex(Regex),
    /// A class name; kiln's linears are `Linear`.
    Class(String),
}

impl ModuleMatcher {
    fn parse(entry: &str) -> Result<ModuleMatcher, String> {
        if let Some(pat) = entry.strip_prefix("re:") {
            return Regex::new(&format!("^(?:{pat})"))
                .map(ModuleMatcher::Regex)
                .map_err(|e| format!("pattern `{entry}`: {e}"));
        }
        // Module paths contain dots; class names (`Linear`, `Qwen3_5GatedDeltaNet`) do not.
        Ok(
            if entry.contains('.') || entry.starts_with(char::is_lowercase) {
                ModuleMatcher::Exact(entry.to_owned())
            } else {
                ModuleMatcher::Class(entry.to_owned())
            },
        )
    }

    /// Whether the linear layer `module` matches.
    fn matches_linear(&self, module: &str) -> bool {
        match self {
            ModuleMatcher::Exact(name) => name == module,
            ModuleMatcher::Regex(re) => re.is_match(module),
            ModuleMatcher::Class(class) => class == "Linear",
        }
    }
}

/// How a quantized module's parts are read, before its shape is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemeTemplate {
    /// compressed-tensors `pack-quantized` int4; `group_size` `None` = per channel (one group
    /// over K).
    CtInt4 {
        /// Inputs per scale.
        group_size: Option<usize>,
        /// No zero points.
        symmetric: bool,
    },
    /// compressed-tensors `nvfp4-pack-quantized`. `w4a4`: the checkpoint also asks for FP4
    /// activations (NVFP4 W4A4); kiln runs it weight-only (16-bit activations), which differs
    /// from the W4A4 reference by the activation rounding (logged at load).
    CtNvfp4 {
        /// `input_activations` are quantized in the reference.
        w4a4: bool,
    },
    /// AutoAWQ GEMM.
    AwqGemm {
        /// Inputs per scale.
        group_size: usize,
    },
    /// GPTQ 4-bit; `group_size` `None` = per channel.
    Gptq {
        /// Inputs per scale.
        group_size: Option<usize>,
        /// `checkpoint_format: gptq` (v1).
        zero_minus_one: bool,
    },
}

/// What to load for one linear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// `<module>.weight`, dense (ignored, not targeted, or an unquantized checkpoint).
    Dense,
    /// The packed parts of this scheme.
    Packed(SchemeTemplate),
}

/// One `config_groups` entry.
#[derive(Debug, Clone)]
struct Group {
    /// `group_0`, … (for messages).
    name: String,
    targets: Vec<ModuleMatcher>,
    /// The scheme, or a description of the one kiln cannot run.
    scheme: Result<SchemeTemplate, String>,
}

/// Which quantization family.
#[derive(Debug, Clone)]
enum Method {
    /// compressed-tensors `config_groups`.
    CompressedTensors(Vec<Group>),
    /// AutoAWQ / GPTQ: every linear of the decoder layers; `lm_head` only if `quantized_head`.
    Uniform {
        scheme: Result<SchemeTemplate, String>,
        quantized_head: bool,
        /// `modules_to_not_convert`: substrings.
        not_converted: Vec<String>,
    },
}

/// A parsed `quantization_config`.
#[derive(Debug, Clone)]
pub struct QuantConfig {
    /// `quant_method` as written.
    quant_method: String,
    method: Method,
    /// compressed-tensors `ignore`.
    ignore: Vec<ModuleMatcher>,
}

fn unsupported_method(method: &str) -> ModelError {
    ModelError::Unsupported(format!(
        "quantization_config.quant_method `{method}` (kiln reads compressed-tensors \
         pack-quantized / nvfp4-pack-quantized, awq (gemm) and gptq, 4-bit)"
    ))
}

/// `Some(n)` for a positive integer, `None` for −1 / null / absent.
fn group_size(v: Option<&Value>) -> Result<Option<usize>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_i64() {
            Some(-1) => Ok(None),
            Some(n) if n > 0 => Ok(Some(n as usize)),
            _ => Err(format!("group_size {v}")),
        },
    }
}

/// A compressed-tensors group's scheme.
fn ct_scheme(group: &Value, default_format: Option<&str>) -> Result<SchemeTemplate, String> {
    let format = group
        .get("format")
        .and_then(Value::as_str)
        .or(default_format)
        .unwrap_or("dense");
    let w = group
        .get("weights")
        .filter(|w| !w.is_null())
        .ok_or("no weight quantization")?;
    let get_str = |k: &str| w.get(k).and_then(Value::as_str);
    let bits = w.get("num_bits").and_then(Value::as_u64).unwrap_or(0);
    let kind = get_str("type").unwrap_or("int");
    let strategy = get_str("strategy").unwrap_or("tensor");
    let symmetric = w.get("symmetric").and_then(Value::as_bool).unwrap_or(true);
    let inputs = group.get("input_activations").filter(|a| !a.is_null());
    let describe = || {
        format!(
            "format `{format}`, weights {bits}-bit {kind} {strategy}{}",
            if inputs.is_some() {
                ", quantized activations"
            } else {
                ""
            }
        )
    };
    match format {
        "pack-quantized" => {
            if bits != 4 || kind != "int" || inputs.is_some() {
                return Err(describe());
            }
            let group_size = match strategy {
                "group" => {
                    Some(group_size(w.get("group_size"))?.ok_or("group without group_size")?)
                }
                "channel" => None,
                _ => return Err(describe()),
            };
            Ok(SchemeTemplate::CtInt4 {
                group_size,
                symmetric,
            })
        }
        "nvfp4-pack-quantized" => {
            let gs = group_size(w.get("group_size"))?;
            if bits != 4 || kind != "float" || gs != Some(16) || !symmetric {
                return Err(describe());
            }
            Ok(SchemeTemplate::CtNvfp4 {
                w4a4: inputs.is_some(),
            })
        }
        _ => Err(describe()),
    }
}

impl QuantConfig {
    /// `quantization_config` of a `config.json` document, or `None` when it has none.
    /// `Unsupported` for an unknown `quant_method`, `Format`-like problems as `Unsupported`
    /// with the field named (`path` names the file).
    pub fn from_config_json(doc: &Value) -> Result<Option<QuantConfig>, ModelError> {
        let q = match doc.get("quantization_config") {
            None | Some(Value::Null) => return Ok(None),
            Some(q) => q,
        };
        let quant_method = q
            .get("quant_method")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let matchers = |key: &str| -> Result<Vec<ModuleMatcher>, ModelError> {
            q.get(key)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(ModuleMatcher::parse)
                        .collect::<Result<Vec<_>, _>>()
                })
                .transpose()
                .map_err(|e| ModelError::Unsupported(format!("quantization_config.{key}: {e}")))
                .map(Option::unwrap_or_default)
        };
        let strings = |key: &str| -> Vec<String> {
            q.get(key)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let method = match quant_method.as_str() {
            "compressed-tensors" => {
                let format = q.get("format").and_then(Value::as_str);
                let groups = q
                    .get("config_groups")
                    .and_then(Value::as_object)
                    .ok_or_else(|| {
                        ModelError::Unsupported(
                            "compressed-tensors quantization_config without config_groups".into(),
                        )
                    })?;
                let mut out = Vec::new();
                for (name, g) in groups {
                    let targets = g
                        .get("targets")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_str)
                                .map(ModuleMatcher::parse)
                                .collect::<Result<Vec<_>, _>>()
                        })
                        .transpose()
                        .map_err(|e| {
                            ModelError::Unsupported(format!("config_groups.{name}.targets: {e}"))
                        })?
                        .unwrap_or_default();
                    out.push(Group {
                        name: name.clone(),
                        targets,
                        scheme: ct_scheme(g, format),
                    });
                }
                Method::CompressedTensors(out)
            }
            "awq" => {
                let bits = q.get("bits").and_then(Value::as_u64).unwrap_or(0);
                let version = q
                    .get("version")
                    .and_then(Value::as_str)
                    .unwrap_or("gemm")
                    .to_ascii_lowercase();
                let zero_point = q.get("zero_point").and_then(Value::as_bool).unwrap_or(true);
                let gs = group_size(q.get("group_size").or_else(|| q.get("q_group_size")));
                let scheme = match (bits, version.as_str(), zero_point, gs.clone()) {
                    (4, "gemm", true, Ok(Some(group_size))) => {
                        Ok(SchemeTemplate::AwqGemm { group_size })
                    }
                    _ => Err(format!(
                        "awq {bits}-bit version `{version}` zero_point {zero_point} group {gs:?}"
                    )),
                };
                Method::Uniform {
                    scheme,
                    quantized_head: false,
                    not_converted: strings("modules_to_not_convert"),
                }
            }
            "gptq" => {
                let bits = q.get("bits").and_then(Value::as_u64).unwrap_or(0);
                let format = q
                    .get("checkpoint_format")
                    .and_then(Value::as_str)
                    .unwrap_or("gptq")
                    .to_owned();
                let gs = group_size(q.get("group_size"));
                let dynamic = q
                    .get("dynamic")
                    .and_then(Value::as_object)
                    .is_some_and(|d| !d.is_empty());
                let scheme = match (bits, format.as_str(), gs.clone(), dynamic) {
                    (4, "gptq" | "gptq_v2", Ok(group_size), false) => Ok(SchemeTemplate::Gptq {
                        group_size,
                        zero_minus_one: format == "gptq",
                    }),
                    _ => Err(format!(
                        "gptq {bits}-bit checkpoint_format `{format}` group {gs:?}{}",
                        if dynamic {
                            " with per-module `dynamic` overrides"
                        } else {
                            ""
                        }
                    )),
                };
                Method::Uniform {
                    scheme,
                    quantized_head: q.get("lm_head").and_then(Value::as_bool).unwrap_or(false),
                    not_converted: strings("modules_to_not_convert"),
                }
            }
            other => return Err(unsupported_method(other)),
        };
        Ok(Some(QuantConfig {
            quant_method,
            method,
            ignore: matchers("ignore")?,
        }))
    }

    /// `quant_method` as written in the file.
    pub fn quant_method(&self) -> &str {
        &self.quant_method
    }

    /// Dense or packed, for the linear layer `module` (e.g. `model.layers.0.mlp.up_proj`).
    /// `Unsupported` names the module and the scheme when the module is quantized in a way
    /// kiln cannot run.
    pub fn decide(&self, module: &str) -> Result<Decision, ModelError> {
        if self.ignore.iter().any(|m| m.matches_linear(module)) {
            return Ok(Decision::Dense);
        }
        let unsupported = |scheme: &str| {
            ModelError::Unsupported(format!(
                "module `{module}` is quantized as {} {scheme}, which kiln cannot run (it reads \
                 4-bit compressed-tensors pack-quantized and nvfp4-pack-quantized, AutoAWQ GEMM \
                 and GPTQ)",
                self.quant_method
            ))
        };
        match &self.method {
            Method::CompressedTensors(groups) => {
                match groups
                    .iter()
                    .find(|g| g.targets.iter().any(|t| t.matches_linear(module)))
                {
                    None => Ok(Decision::Dense),
                    Some(g) => match &g.scheme {
                        Ok(s) => Ok(Decision::Packed(s.clone())),
                        Err(d) => Err(unsupported(&format!("({}: {d})", g.name))),
                    },
                }
            }
            Method::Uniform {
                scheme,
                quantized_head,
                not_converted,
            } => {
                let is_head = module == "lm_head" || module.ends_with(".lm_head");
                if (is_head && !quantized_head)
                    || not_converted.iter().any(|s| module.contains(s.as_str()))
                {
                    return Ok(Decision::Dense);
                }
                match scheme {
                    Ok(s) => Ok(Decision::Packed(s.clone())),
                    Err(d) => Err(unsupported(&format!("({d})"))),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
