//! Token vectors → one vector per input, as sentence-transformers' `Pooling` module computes
//! it (one input at a time, so no padding enters a mean), and its `Normalize` module.

use serde_json::Value;

use super::EmbedError;

/// How an input's token vectors become its one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The first token's vector (BERT's `[CLS]`).
    Cls,
    /// The mean over all tokens.
    Mean,
    /// The element-wise maximum over all tokens.
    Max,
    /// The sum over all tokens divided by √(token count).
    MeanSqrtLen,
    /// The last token's vector: what a causal decoder has seen the whole input by.
    LastToken,
}

/// `pooling_mode_*` keys of `1_Pooling/config.json`, and the mode each means.
const MODES: [(&str, Option<Pooling>); 6] = [
    ("pooling_mode_cls_token", Some(Pooling::Cls)),
    ("pooling_mode_mean_tokens", Some(Pooling::Mean)),
    ("pooling_mode_max_tokens", Some(Pooling::Max)),
    (
        "pooling_mode_mean_sqrt_len_tokens",
        Some(Pooling::MeanSqrtLen),
    ),
    // Position-weighted means exist in sentence-transformers but in no model we serve.
    ("pooling_mode_weightedmean_tokens", None),
    ("pooling_mode_lasttoken", Some(Pooling::LastToken)),
];

impl Pooling {
    /// The one mode a sentence-transformers Pooling config turns on. Several modes at once
    /// (whose vectors sentence-transformers concatenates) are refused rather than run as one.
    pub fn from_config(config: &Value) -> Result<Pooling, EmbedError> {
        let on: Vec<(&str, Option<Pooling>)> = MODES
            .iter()
            .copied()
            .filter(|(key, _)| config.get(key).and_then(Value::as_bool) == Some(true))
            .collect();
        match on.as_slice() {
            [(_, Some(mode))] => Ok(*mode),
            [(key, None)] => Err(EmbedError::Load(format!(
                "pooling mode `{key}` is not supported"
            ))),
            [] => Err(EmbedError::Load(
                "the Pooling config turns no mode on".into(),
            )),
            many => Err(EmbedError::Load(format!(
                "the Pooling config turns on {} modes ({}); one is supported",
                many.len(),
                many.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
            ))),
        }
    }

    /// Pools `rows` (`n` token vectors of `dim` floats, in input order) into `dim` floats.
    ///
    /// # Panics
    /// If `rows` is empty or not a whole number of `dim`-wide rows (inputs are checked to
    /// be non-empty before they run).
    pub fn pool(self, rows: &[f32], dim: usize) -> Vec<f32> {
        assert!(
            dim > 0 && !rows.is_empty() && rows.len().is_multiple_of(dim),
            "pool: {} floats are not rows of {dim}",
            rows.len()
        );
        let n = rows.len() / dim;
        let mut tokens = rows.chunks_exact(dim);
        match self {
            Pooling::Cls => rows[..dim].to_vec(),
            Pooling::LastToken => rows[rows.len() - dim..].to_vec(),
            Pooling::Mean | Pooling::MeanSqrtLen => {
                let mut sum = vec![0f32; dim];
                for row in tokens {
                    sum.iter_mut().zip(row).for_each(|(s, v)| *s += v);
                }
                let divisor = match self {
                    Pooling::Mean => n as f32,
                    _ => (n as f32).sqrt(),
                };
                sum.iter_mut().for_each(|s| *s /= divisor);
                sum
            }
            Pooling::Max => {
                let mut max = tokens.next().map(<[f32]>::to_vec).unwrap_or_default();
                for row in tokens {
                    max.iter_mut().zip(row).for_each(|(m, &v)| *m = m.max(v));
                }
                max
            }
        }
    }
}

/// Scales `v` to unit length, as sentence-transformers' `Normalize` does (a zero vector
/// stays zero: torch's `normalize` divides by `max(‖v‖, 1e-12)`).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= norm);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ROWS: [f32; 6] = [1.0, -2.0, 3.0, 4.0, 5.0, 0.0];

    #[test]
    fn each_mode_pools_three_tokens_of_two_floats() {
        assert_eq!(Pooling::Cls.pool(&ROWS, 2), [1.0, -2.0]);
        assert_eq!(Pooling::LastToken.pool(&ROWS, 2), [5.0, 0.0]);
        assert_eq!(Pooling::Mean.pool(&ROWS, 2), [3.0, 2.0 / 3.0]);
        assert_eq!(Pooling::Max.pool(&ROWS, 2), [5.0, 4.0]);
        let s = 3f32.sqrt();
        assert_eq!(Pooling::MeanSqrtLen.pool(&ROWS, 2), [9.0 / s, 2.0 / s]);
    }

    #[test]
    fn the_one_mode_turned_on_is_read_and_several_are_refused() {
        let mean = json!({"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": false});
        assert_eq!(Pooling::from_config(&mean).ok(), Some(Pooling::Mean));
        let last = json!({"pooling_mode_lasttoken": true, "include_prompt": true});
        assert_eq!(Pooling::from_config(&last).ok(), Some(Pooling::LastToken));
        let two = json!({"pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": true});
        assert!(Pooling::from_config(&two).is_err());
        assert!(Pooling::from_config(&json!({})).is_err());
        let weighted = json!({"pooling_mode_weightedmean_tokens": true});
        assert!(Pooling::from_config(&weighted).is_err());
    }

    #[test]
    fn normalising_gives_unit_length_and_leaves_zero_alone() {
        let mut v = [3.0, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, [0.6, 0.8]);
        let mut zero = [0.0, 0.0];
        l2_normalize(&mut zero);
        assert_eq!(zero, [0.0, 0.0]);
    }
}
