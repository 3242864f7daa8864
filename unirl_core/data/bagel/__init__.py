"""BAGEL's data contracts (t2i_pretrain, unified_edit, vlm_sft), without its silent data loss. See FORMATS.md 5."""
