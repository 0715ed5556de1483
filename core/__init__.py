"""The Beam-free layer that pipelines, transforms and trainers all import: object-store I/O, the
codec, config keys, reading a published dataset folder, prompt formats, element OCR's frame, and the
voxel backbone network the pipeline runs frozen and a trainer pre-trains. Nothing here imports
Beam, so a trainer on a GPU box needs none of the pipeline's dependencies."""
