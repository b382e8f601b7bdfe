//! Secrets the control plane hands out once and then knows only by hash: API keys and runner
//! tokens. Each is a recognisable prefix plus random alphanumerics; only its SHA-256 is
//! stored, so a leaked database leaks nothing usable.

use rand::distributions::Alphanumeric;
use rand::Rng;
use sha2::{Digest, Sha256};

/// Random characters after the prefix: 32 alphanumerics, about 190 bits.
pub const RANDOM_CHARS: usize = 32;

/// Characters after the prefix kept in clear (a `prefix` column) to tell secrets apart.
pub const SHOWN_RANDOM_CHARS: usize = 4;

/// A new secret: `prefix` and [`RANDOM_CHARS`] random alphanumerics.
pub fn generate(prefix: &str) -> String {
    // thread_rng is a CSPRNG (ChaCha, reseeded from the OS).
    let random: String = rand::thread_rng()
        .sample_iter(&Alphanumeric)
        .take(RANDOM_CHARS)
        .map(char::from)
        .collect();
    format!("{prefix}{random}")
}

/// What may be shown of a secret made by [`generate`] with `prefix`.
pub fn shown(prefix: &str, secret: &str) -> String {
    secret
        .chars()
        .take(prefix.chars().count() + SHOWN_RANDOM_CHARS)
        .collect()
}

/// SHA-256 of the secret, lowercase hex: what the `*_hash` columns hold.
pub fn hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_its_prefix_and_32_alphanumerics() {
        let secret = generate("rt-fallow-");
        let random = secret.strip_prefix("rt-fallow-").expect("the prefix");
        assert_eq!(random.len(), 32);
        assert!(random.chars().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(secret, generate("rt-fallow-"));
    }

    #[test]
    fn only_the_prefix_and_four_characters_are_shown() {
        assert_eq!(shown("sk-", "sk-abcdefgh"), "sk-abcd");
    }

    #[test]
    fn hashes_are_sha256_hex() {
        assert_eq!(
            hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
