//! WireGuard's keys in their text form (32 bytes, base64), as `wg genkey`
//! and `wg pubkey` write them.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use boringtun::x25519::{PublicKey, StaticSecret};

/// A key in WireGuard's text form (32 bytes, base64), as `wg genkey` and
/// `wg pubkey` write them.
#[derive(Clone, PartialEq, Eq)]
pub struct Key(pub(super) [u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Private keys never reach a log: show nothing of the bytes.
        f.write_str("Key(..)")
    }
}

/// Why a text is not a key. The decoder's error is part of the message,
/// not a source: clap shows a flag's parse error by its message alone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("not base64: {0}")]
    NotBase64(base64::DecodeError),
    #[error("{0} bytes, a key has 32")]
    Length(usize),
}

impl std::str::FromStr for Key {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, KeyError> {
        let bytes = BASE64.decode(s.trim()).map_err(KeyError::NotBase64)?;
        let bytes: [u8; 32] = bytes
            .try_into()
            .map_err(|b: Vec<u8>| KeyError::Length(b.len()))?;
        Ok(Self(bytes))
    }
}

impl Key {
    /// A new private key from the system's random source.
    pub fn generate() -> Self {
        Self(StaticSecret::random_from_rng(rand_core::OsRng).to_bytes())
    }

    /// The key in WireGuard's text form. Not `Display`, so that a private
    /// key never reaches a log by a stray `{}`: only where it must go
    /// (its Secret, a tunnel process's standard input).
    pub fn expose(&self) -> String {
        BASE64.encode(self.0)
    }

    /// The public key of this private key, in WireGuard's text form.
    pub fn public_of_private(&self) -> String {
        let secret = StaticSecret::from(self.0);
        BASE64.encode(PublicKey::from(&secret).as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_as_wireguard_writes_them() {
        // RFC 7748's test vector: Alice's private and public keys.
        let private: Key = "dwdtCnMYpX08FsFyUbJmRd9ML4frwJkqsXf7pR25LCo="
            .parse()
            .expect("key");
        assert_eq!(
            private.public_of_private(),
            "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo="
        );
        assert!("c2hvcnQ=".parse::<Key>().is_err());
        assert!("not base64!".parse::<Key>().is_err());
        assert_eq!(format!("{private:?}"), "Key(..)");
    }
}
