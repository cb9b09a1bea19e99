//! Load classification (Constant / Strided / Irregular) and basic-block
//! proxy compression (MemGaze paper §III-B).
