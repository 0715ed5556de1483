"""The ConcreTizer trainers: the inversion network that restores a LiDAR scan from frozen
VoxelBackBone8x features (inversion.py), and the detector pre-training that gives the backbone
trained weights to invert (pretraining.py).

    frames.py       the shards a trainer reads: frame splits, features and occupancy per frame
    model.py        the inversion network (generative upsampling, occupancy per stride)
    metrics.py      occupancy precision/recall/F1 and the Chamfer distance
    evaluation.py   the threshold chosen on validation frames, the evaluation, the bird's-eye plot
    inversion.py    the inversion recipe, `train` and its report
    detector.py     the CenterPoint-style detector around the shared backbone
    pretraining.py  the detector pre-training recipe, `train` and its report
"""
