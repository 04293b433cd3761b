//! The engine embeds its migrations at build time (`refinery::embed_migrations!`, in
//! `src/schema.rs`); a macro reads files cargo does not know about, so a new or edited
//! migration would not rebuild the engine without this.

fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
