//! [`Text`]: a shared, immutable string of an annotation.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use smallvec::SmallVec;
use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// An immutable string that clones share: a load's `file:line` texts and
/// register names repeat across hundreds of thousands of loads, so a
/// writer keeps one copy of each distinct text ([`TextTable`]) and every
/// load a handle to it, one pointer wide (`Option<Text>` too): a load has
/// five of them. Serialised as a plain JSON string.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Text(Arc<Box<str>>);

impl Text {
    /// The string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Text {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Text {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Text {
        Text(Arc::new(Box::from(s)))
    }
}

impl From<String> for Text {
    fn from(s: String) -> Text {
        Text(Arc::new(s.into_boxed_str()))
    }
}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.as_str(), f)
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl Serialize for Text {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Text, D::Error> {
        String::deserialize(deserializer).map(Text::from)
    }
}

/// The distinct texts made so far: [`TextTable::text`] gives the one
/// [`Text`] of each distinct string.
#[derive(Debug, Default)]
pub struct TextTable {
    texts: foldhash::HashSet<Text>,
}

impl TextTable {
    /// The table's [`Text`] of `s`, added when new.
    pub fn text(&mut self, s: &str) -> Text {
        if let Some(text) = self.texts.get(s) {
            return text.clone();
        }
        let text = Text::from(s);
        self.texts.insert(text.clone());
        text
    }

    /// How many distinct texts it holds.
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }
}

/// A load's inline chain ([`super::LoadSite::inline_chain`]): `file:line`
/// texts, innermost first. One pointer wide, and nothing allocated when
/// empty (as most loads' chains are while the rewriter holds them); clones
/// share the texts. Serialised as a plain JSON array of strings.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct InlineChain(Option<Arc<ChainTexts>>);

/// A chain's texts: up to [`CHAIN_INLINE`] lie in the `Arc`'s own block,
/// one allocation a chain rather than a list and its `Arc` (the rewriter
/// makes hundreds of thousands of chains).
type ChainTexts = SmallVec<[Text; CHAIN_INLINE]>;

/// Of the chains a large Rust binary's loads are given (the own release
/// binary's 264,000), 54% have at most four texts and 81% at most eight:
/// a chain longer than the inline room is a second allocation (its list),
/// collected into a `Vec` first.
const CHAIN_INLINE: usize = 8;

impl InlineChain {
    /// The texts, innermost first.
    pub fn as_slice(&self) -> &[Text] {
        self.0.as_deref().map_or(&[], |texts| texts.as_slice())
    }

    /// Whether the chain has no entry (the load's code is not inlined).
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Whether the two are one chain (clones of each other): then they
    /// have the same texts, without comparing them.
    pub fn is_shared_with(&self, other: &InlineChain) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        }
    }

    /// The chain of `innermost`, then `outer_first` from its last text to
    /// its first (a reader of nested call sites keeps them outermost
    /// first, so that a change of the inner ones keeps a prefix). Built in
    /// its `Arc` where it fits the inline room: collected through an
    /// iterator and then moved into the `Arc`, a chain's texts cost about
    /// as much as its allocation.
    pub fn of_reversed(innermost: &Text, outer_first: &[Text]) -> InlineChain {
        let len = 1 + outer_first.len();
        if len > CHAIN_INLINE {
            let mut texts = Vec::with_capacity(len);
            texts.push(innermost.clone());
            texts.extend(outer_first.iter().rev().cloned());
            return InlineChain::from(texts);
        }
        let mut chain = Arc::new(ChainTexts::new());
        let texts = Arc::get_mut(&mut chain).expect("a new chain is not shared");
        texts.push(innermost.clone());
        for text in outer_first.iter().rev() {
            texts.push(text.clone());
        }
        InlineChain(Some(chain))
    }

    /// The chain of `texts`, nothing allocated when there are none.
    fn of(texts: ChainTexts) -> InlineChain {
        InlineChain((!texts.is_empty()).then(|| Arc::new(texts)))
    }
}

impl Deref for InlineChain {
    type Target = [Text];
    fn deref(&self) -> &[Text] {
        self.as_slice()
    }
}

impl From<Vec<Text>> for InlineChain {
    fn from(texts: Vec<Text>) -> InlineChain {
        InlineChain::of(ChainTexts::from_vec(texts))
    }
}

impl FromIterator<Text> for InlineChain {
    fn from_iter<I: IntoIterator<Item = Text>>(texts: I) -> InlineChain {
        let texts = texts.into_iter();
        match texts.size_hint() {
            (len, Some(most)) if len == most && len <= CHAIN_INLINE => {
                InlineChain::of(texts.collect())
            }
            // Collected at their number: a `SmallVec` that spills rounds
            // its room up to a power of two.
            _ => InlineChain::from(texts.collect::<Vec<Text>>()),
        }
    }
}

impl<'a> IntoIterator for &'a InlineChain {
    type Item = &'a Text;
    type IntoIter = std::slice::Iter<'a, Text>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}

impl fmt::Debug for InlineChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_slice(), f)
    }
}

impl Serialize for InlineChain {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.as_slice().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for InlineChain {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<InlineChain, D::Error> {
        Vec::<Text>::deserialize(deserializer).map(InlineChain::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_serialises_as_its_string_and_back() {
        let text = Text::from("src/lib.rs:7");
        let json = serde_json::to_string(&text).unwrap();
        assert_eq!(json, r#""src/lib.rs:7""#);
        assert_eq!(serde_json::from_str::<Text>(&json).unwrap(), text);
        assert_eq!(format!("{text:?}"), format!("{:?}", "src/lib.rs:7"));
    }

    #[test]
    fn the_table_gives_one_shared_text_per_distinct_string() {
        let mut table = TextTable::default();
        let a = table.text("a.rs:1");
        let b = table.text(&String::from("a.rs:1"));
        let c = table.text("a.rs:2");
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert!(!Arc::ptr_eq(&a.0, &c.0));
        assert_eq!((table.len(), &*a, &*c), (2, "a.rs:1", "a.rs:2"));
    }

    #[test]
    fn an_inline_chain_serialises_as_an_array_and_an_empty_one_allocates_nothing() {
        let chain = InlineChain::from(vec![Text::from("a.rs:1"), Text::from("b.rs:2")]);
        let json = serde_json::to_string(&chain).unwrap();
        assert_eq!(json, r#"["a.rs:1","b.rs:2"]"#);
        assert_eq!(serde_json::from_str::<InlineChain>(&json).unwrap(), chain);
        assert_eq!(format!("{chain:?}"), r#"["a.rs:1", "b.rs:2"]"#);
        assert_eq!((chain.len(), &*chain[1]), (2, "b.rs:2"));
        let empty = serde_json::from_str::<InlineChain>("[]").unwrap();
        assert!(empty.is_empty() && empty.0.is_none());
        assert_eq!(empty, InlineChain::default());
        assert_eq!(size_of::<InlineChain>(), size_of::<usize>());
    }

    /// Chains short enough to lie in their `Arc` and longer ones read,
    /// compare and hash as their texts, whether collected or made of a
    /// `Vec`.
    #[test]
    fn inline_chains_of_any_length_are_their_texts() {
        use std::hash::BuildHasher;
        let hasher = foldhash::fast::FixedState::with_seed(7);
        for n in 0..=9 {
            let texts: Vec<Text> = (0..n).map(|i| Text::from(format!("f.rs:{i}"))).collect();
            let collected: InlineChain = texts.iter().cloned().collect();
            let made = InlineChain::from(texts.clone());
            assert_eq!(collected.as_slice(), texts.as_slice());
            assert_eq!(made, collected);
            if let Some((innermost, rest)) = texts.split_first() {
                let outer_first: Vec<Text> = rest.iter().rev().cloned().collect();
                let reversed = InlineChain::of_reversed(innermost, &outer_first);
                assert_eq!(reversed, collected);
                assert_eq!(hasher.hash_one(&reversed), hasher.hash_one(&collected));
            }
            assert_eq!(collected.is_empty(), n == 0);
            // Hashed as the list of texts was: maps keyed by chains keep
            // their order.
            let expected = (n > 0).then_some(texts.as_slice());
            assert_eq!(hasher.hash_one(&collected), hasher.hash_one(expected));
            assert_eq!(size_of::<InlineChain>(), size_of::<usize>());
        }
    }

    /// Clones are one chain; chains of equal texts made apart are not,
    /// and empty chains are one another's.
    #[test]
    fn clones_of_a_chain_are_shared_and_equal_chains_made_apart_are_not() {
        let texts = vec![Text::from("a.rs:1"), Text::from("b.rs:2")];
        let chain = InlineChain::from(texts.clone());
        assert!(chain.is_shared_with(&chain.clone()));
        let apart = InlineChain::from(texts);
        assert_eq!(apart, chain);
        assert!(!apart.is_shared_with(&chain));
        assert!(InlineChain::default().is_shared_with(&InlineChain::default()));
        assert!(!chain.is_shared_with(&InlineChain::default()));
        assert!(!InlineChain::default().is_shared_with(&chain));
    }

    /// A load holds five optional texts: each is one pointer wide.
    #[test]
    fn a_text_and_an_absent_one_are_one_pointer_wide() {
        assert_eq!(size_of::<Text>(), size_of::<usize>());
        assert_eq!(size_of::<Option<Text>>(), size_of::<usize>());
    }
}
