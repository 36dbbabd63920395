//! Documents: what users upload and what the workers do with it. The type is decided by
//! content ([`sniff`]), uploads are checked while they stream ([`intake`]), bytes live in blob
//! storage ([`blobs`]), workers extract the text ([`extract`]) and ask a provider
//! ([`providers`]) through the document [`processor`].

pub mod backup_holds;
pub mod blobs;
pub mod calls;
pub mod cpu;
pub mod custody;
pub mod economy;
pub mod encoding;
pub mod estimate;
pub mod extract;
pub mod glossaries;
pub mod glossary;
pub mod html;
pub mod images;
pub mod inline;
pub mod intake;
pub mod kept_answers;
pub mod markers;
pub mod ocr;
pub mod ocr_config;
pub mod ocr_text;
pub mod office;
pub mod payload;
pub mod pieces;
pub mod processor;
pub mod providers;
pub mod ratio;
pub mod render;
pub mod sandbox;
pub mod sniff;
pub mod split;
pub mod store_space;
pub mod sweep;
pub mod tokens;

pub use blobs::Blobs;
pub use sniff::DocType;
