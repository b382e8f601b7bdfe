use super::*;

fn matcher(stops: &[&str]) -> StopMatcher {
    StopMatcher::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>())
}

/// Streams `pieces`, returning what was emitted after each and the final match.
fn stream(m: &mut StopMatcher, pieces: &[&str]) -> (Vec<String>, Option<usize>) {
    let mut emitted = Vec::new();
    for piece in pieces {
        let mut out = String::new();
        let matched = m.push(piece, true, &mut out);
        emitted.push(out);
        if matched.is_some() {
            return (emitted, matched);
        }
    }
    (emitted, None)
}

#[test]
fn a_stop_string_split_across_tokens_is_matched_and_never_streamed() {
    let mut m = matcher(&["###"]);
    let (emitted, matched) = stream(&mut m, &["Hello #", "#", "# world"]);
    assert_eq!(emitted, vec!["Hello ", "", ""]);
    assert_eq!(matched, Some(0));
    assert_eq!(m.stop(0), Some("###"));
}

#[test]
fn held_text_is_released_when_it_turns_out_not_to_be_a_stop() {
    let mut m = matcher(&["###"]);
    let (emitted, matched) = stream(&mut m, &["a #", "# b"]);
    assert_eq!(emitted, vec!["a ", "## b"]);
    assert_eq!(matched, None);
}

#[test]
fn text_before_the_match_in_the_same_token_is_kept() {
    let mut m = matcher(&["STOP"]);
    let (emitted, matched) = stream(&mut m, &["abc STOP def"]);
    assert_eq!(emitted, vec!["abc "]);
    assert_eq!(matched, Some(0));
}

#[test]
fn the_earliest_of_several_stops_wins() {
    let mut m = matcher(&["world", "lo"]);
    let (emitted, matched) = stream(&mut m, &["hello world"]);
    assert_eq!(emitted, vec!["hel"]);
    assert_eq!(matched, Some(1));
}

#[test]
fn flush_releases_held_text_at_the_end() {
    let mut m = matcher(&["</s>"]);
    let mut out = String::new();
    assert_eq!(m.push("end </", true, &mut out), None);
    assert_eq!(out, "end ");
    m.flush(&mut out);
    assert_eq!(out, "end </");
}

#[test]
fn holding_back_respects_utf8_boundaries() {
    let mut m = matcher(&["éé!"]);
    let (emitted, matched) = stream(&mut m, &["café", "é", "!"]);
    assert_eq!(emitted, vec!["caf", "", ""]);
    assert_eq!(matched, Some(0));
}

#[test]
fn without_stop_strings_everything_flows() {
    let mut m = matcher(&[""]);
    let mut out = String::new();
    assert_eq!(m.push("a", true, &mut out), None);
    assert_eq!(out, "a");
}

#[test]
fn before_min_tokens_stop_strings_do_not_end_the_choice() {
    let mut m = matcher(&["x"]);
    let mut out = String::new();
    assert_eq!(m.push("axb", false, &mut out), None);
    assert_eq!(out, "axb");
}

#[test]
fn token_conditions_cover_eos_stop_ids_and_length() {
    let params = Sampling {
        stop_token_ids: vec![5],
        min_tokens: 2,
        ..Sampling::default()
    };
    let c = StopConditions::new(&params, &[2], 4);
    assert_eq!(c.check(2, 1), None, "EOS before min_tokens does not stop");
    assert_eq!(c.check(2, 2), Some(TokenStop::Eos(2)));
    assert_eq!(c.check(5, 3), Some(TokenStop::StopToken(5)));
    assert_eq!(c.check(7, 3), None);
    assert_eq!(c.check(7, 4), Some(TokenStop::Length));
    assert_eq!(
        TokenStop::StopToken(5).matched(),
        Some(serde_json::json!(5))
    );
    assert_eq!(TokenStop::Length.finish_reason(), FinishReason::Length);
}

#[test]
fn ignore_eos_keeps_generating_through_eos() {
    let params = Sampling {
        ignore_eos: true,
        ..Sampling::default()
    };
    let c = StopConditions::new(&params, &[2], 10);
    assert_eq!(c.check(2, 3), None);
}

/// However the text is cut into tokens, the streamed output is the text before the first
/// stop string, and nothing streamed is ever part of a match.
#[test]
fn any_token_split_streams_the_same_text() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let cases = [
        (
            "the end is near. THE END",
            vec!["END", "near!"],
            "the end is near. THE ",
        ),
        ("aaab", vec!["aab"], "a"),
        ("ü→ü→stop", vec!["→s"], "ü→ü"),
        ("no stop here", vec!["zzz"], "no stop here"),
    ];
    for (text, stops, expected) in cases {
        for _ in 0..200 {
            let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
            let mut m = StopMatcher::new(&stops);
            let mut out = String::new();
            let mut rest = text;
            let mut matched = None;
            while !rest.is_empty() && matched.is_none() {
                let mut cut = rng.gen_range(1..=rest.len());
                while !rest.is_char_boundary(cut) {
                    cut += 1;
                }
                matched = m.push(&rest[..cut], true, &mut out);
                rest = &rest[cut..];
            }
            if matched.is_none() {
                m.flush(&mut out);
            }
            assert_eq!(out, expected, "stops {stops:?}");
        }
    }
}

/// The matcher's specification: every stop searched for in all held text on every push
/// (the earliest start wins, then the lower index), and the longest suffix that begins a
/// stop held back.
#[derive(Default)]
struct Reference {
    stops: Vec<String>,
    held: String,
}

impl Reference {
    fn push(&mut self, delta: &str, allow_match: bool, out: &mut String) -> Option<usize> {
        self.held.push_str(delta);
        if allow_match {
            let earliest = self
                .stops
                .iter()
                .enumerate()
                .filter_map(|(i, stop)| self.held.find(stop.as_str()).map(|pos| (pos, i)))
                .min();
            if let Some((pos, index)) = earliest {
                out.push_str(&self.held[..pos]);
                self.held.clear();
                return Some(index);
            }
        }
        let keep_from = (0..self.held.len())
            .filter(|&start| self.held.is_char_boundary(start))
            .find(|&start| {
                let suffix = &self.held[start..];
                self.stops
                    .iter()
                    .any(|s| s.len() > suffix.len() && s.starts_with(suffix))
            })
            .unwrap_or(self.held.len());
        out.push_str(&self.held[..keep_from]);
        self.held.replace_range(..keep_from, "");
        None
    }
}

/// Random texts over a small alphabet, random stops drawn from them, random token cuts and
/// a random `min_tokens` point: the automaton streams exactly what the reference does.
#[test]
fn the_automaton_streams_exactly_what_searching_every_stop_does() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(38);
    let alphabet = ['a', 'b', 'é', '#'];
    let word = |rng: &mut rand::rngs::StdRng, len: usize| -> String {
        (0..len)
            .map(|_| alphabet[rng.gen_range(0..alphabet.len())])
            .collect()
    };
    for _ in 0..3000 {
        let text_len = rng.gen_range(0..40);
        let text = word(&mut rng, text_len);
        let stops: Vec<String> = (0..rng.gen_range(1..5))
            .map(|_| {
                let len = rng.gen_range(1..6);
                word(&mut rng, len)
            })
            .collect();
        let mut ours = StopMatcher::new(&stops);
        let mut reference = Reference {
            stops: stops.clone(),
            ..Reference::default()
        };
        let allow_after = rng.gen_range(0..4);
        let (mut out_ours, mut out_ref) = (String::new(), String::new());
        let mut rest = text.as_str();
        let mut pushes = 0;
        while !rest.is_empty() {
            let mut cut = rng.gen_range(1..=rest.len().min(6));
            while !rest.is_char_boundary(cut) {
                cut += 1;
            }
            let allow = pushes >= allow_after;
            pushes += 1;
            let a = ours.push(&rest[..cut], allow, &mut out_ours);
            let b = reference.push(&rest[..cut], allow, &mut out_ref);
            assert_eq!(a, b, "text {text:?} stops {stops:?}");
            assert_eq!(out_ours, out_ref, "text {text:?} stops {stops:?}");
            if a.is_some() {
                break;
            }
            rest = &rest[cut..];
        }
    }
}

/// A 100 KB stop string among 16 is found across token boundaries, the text before it
/// streams, and a near miss of it is released rather than held for ever.
#[test]
fn a_100_kb_stop_among_16_still_matches() {
    let long = "x".repeat(100 * 1024 - 1) + "!";
    let mut stops: Vec<String> = (0..15).map(|i| format!("never{i}")).collect();
    stops.push(long.clone());
    let mut m = StopMatcher::new(&stops);
    let mut out = String::new();
    assert_eq!(m.push("before ", true, &mut out), None);
    for chunk in long.as_bytes().chunks(7) {
        let chunk = std::str::from_utf8(chunk).unwrap();
        if let Some(index) = m.push(chunk, true, &mut out) {
            assert_eq!(index, 15);
            assert_eq!(out, "before ");
            assert_eq!(m.stop(index), Some(long.as_str()));
            return;
        }
    }
    panic!("the long stop did not match");
}

#[test]
fn a_near_miss_of_a_long_stop_is_released() {
    let long = "x".repeat(100 * 1024 - 1) + "!";
    let mut m = StopMatcher::new(&[long]);
    let mut out = String::new();
    let text = "x".repeat(5000) + "?";
    for chunk in text.as_bytes().chunks(3) {
        assert_eq!(
            m.push(std::str::from_utf8(chunk).unwrap(), true, &mut out),
            None
        );
    }
    assert_eq!(
        out, text,
        "nothing is held once the text can no longer begin the stop"
    );
}

#[test]
fn stop_token_ids_are_found_in_any_order() {
    let params = Sampling {
        stop_token_ids: vec![900, 3, 77, 3],
        ..Sampling::default()
    };
    let c = StopConditions::new(&params, &[2], 100);
    for id in [3, 77, 900] {
        assert_eq!(c.check(id, 1), Some(TokenStop::StopToken(id)));
    }
    assert_eq!(c.check(78, 1), None);
}
