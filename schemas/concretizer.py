"""concretizer: voxelized LiDAR scans, frozen voxel-backbone features and occupancy targets
(ConcreTizer, ICLR 2025; docs/papers/concretizer.md).

Sparse tensors are stored one row per frame (and per layer or stride), as Arrow lists a trainer
turns into numpy without a second copy: `coords` is list<fixed_size_list<int32, 3>> in (z, y, x)
order (the batch index is added by the trainer), so `column.flatten().flatten().to_numpy()`
reshaped to (-1, 3) is a zero-copy view; `values` are the raw little-endian bytes of an
(n, channels) array of `dtype`, read with numpy.frombuffer. Features are float16 or float32 as
the run configured (`dtype` says which).
"""
import pyarrow as pa

from schemas.table import Field, TableSchema

DATASET = "concretizer"

LAYERS = ("conv1", "conv2", "conv3", "conv4")
STRIDES = (1, 2, 4, 8)
SOURCES = ("kitti", "waymo", "nuscenes", "pcd", "ply", "sim")

XYZ3 = pa.list_(pa.float32(), 3)
COORDS = pa.list_(pa.list_(pa.int32(), 3))
INT3 = pa.list_(pa.int32(), 3)
LABEL = pa.struct([
    pa.field("type", pa.string(), nullable=False),
    pa.field("box", pa.list_(pa.float32(), 7), nullable=False),  # x, y, z, dx, dy, dz, heading (LiDAR frame)
])

FRAMES = TableSchema(
    dataset=DATASET,
    table="frames",
    version=3,  # 2: the id includes a digest of the scan's points, the source_ref its last three path parts;
                # 3: point_processing
    doc="One LiDAR frame after cropping: its points, labels and voxel grid.",
    split_field="source",
    fields=(
        Field("id", pa.string(), "Stable hash of the source reference, point layout, preset, voxel mode and, for a "
              "scan, a digest of its points (two scans that share a name are two frames; a copy of a scan is one)."),
        Field("source", pa.string(), "One of: " + ", ".join(SOURCES) + "."),
        Field("source_ref", pa.string(), "The scan's last three path parts (KITTI: training/velodyne/000000.bin); "
              "sim:<seed>:<index> for simulated scans."),
        Field("preset", pa.string(), "Voxelization preset (kitti or waymo: OpenPCDet ranges and voxel sizes)."),
        Field("point_features", pa.list_(pa.string()), "Names of the point columns, e.g. [x, y, z, intensity]."),
        Field("point_processing", pa.list_(pa.string()), "What was done to the scan's points before the range crop, "
              "in order: camera_fov (KITTI: camera 2's field of view kept), drop_no_label_zone (Waymo .npy: points "
              "with an NLZ flag dropped), tanh_intensity (Waymo: intensity is tanh(intensity), as OpenPCDet reads "
              "it); empty for none."),
        Field("points", pa.binary(), "float32 little-endian (num_points, len(point_features)) array of the points "
              "kept after the range crop (and the camera field of view where the preset uses it)."),
        Field("num_points", pa.int64(), "Points kept."),
        Field("num_points_raw", pa.int64(), "Points in the scan before cropping."),
        Field("labels", pa.list_(LABEL), "Object boxes in the LiDAR frame (empty when the source has none)."),
        Field("grid_size", INT3, "Voxel grid (z, y, x) of the preset, e.g. [41, 1600, 1408] for KITTI."),
        Field("point_cloud_range", pa.list_(pa.float32(), 6), "x_min, y_min, z_min, x_max, y_max, z_max in metres."),
        Field("voxel_size", XYZ3, "Voxel edge lengths (x, y, z) in metres."),
    ),
)

VOXELS = TableSchema(
    dataset=DATASET,
    table="voxels",
    version=1,
    doc="Hard voxelization of a frame (OpenPCDet conventions) with MeanVFE features.",
    fields=(
        Field("id", pa.string(), "Stable hash of the frame id and the voxelization settings."),
        Field("frame_id", pa.string(), "The `frames` row."),
        Field("coords", COORDS, "Voxel coordinates (z, y, x), in the order spconv's PointToVoxel gives them."),
        Field("num_points", pa.list_(pa.int32()), "Points in each voxel (at most max_points_per_voxel)."),
        Field("features", pa.binary(), "float32 (num_voxels, len(point_features)) MeanVFE: the mean of each "
              "voxel's points."),
        Field("num_voxels", pa.int64(), "Voxels kept (at most max_voxels)."),
        Field("max_points_per_voxel", pa.int32(), "Cap on points per voxel."),
        Field("max_voxels", pa.int32(), "Cap on voxels per frame (the train or test value of the preset)."),
    ),
)

FEATURES = TableSchema(
    dataset=DATASET,
    table="features",
    version=1,
    doc="Sparse features of one backbone layer for one frame (the inversion model's input).",
    split_field="layer",
    fields=(
        Field("id", pa.string(), "Stable hash of the frame id, layer and backbone weights."),
        Field("frame_id", pa.string(), "The `frames` row."),
        Field("layer", pa.string(), "conv1, conv2, conv3, conv4 (VoxelBackBone8x stages) or bev (conv_out "
              "flattened to a bird's-eye map)."),
        Field("stride", INT3, "Stride (z, y, x) of the layer's grid relative to the voxel grid."),
        Field("spatial_shape", INT3, "The layer's grid (z, y, x)."),
        Field("coords", COORDS, "Active sites (z, y, x) of the layer."),
        Field("channels", pa.int32(), "Feature channels (16, 32, 64, 64; 256 for bev)."),
        Field("dtype", pa.string(), "float16 or float32: the element type of `values`."),
        Field("values", pa.binary(), "Little-endian (len(coords), channels) array of `dtype`."),
        Field("backbone", pa.string(), "Where the weights came from: seed:<n> or the checkpoint's sha256."),
    ),
)

OCCUPANCY = TableSchema(
    dataset=DATASET,
    table="occupancy",
    version=1,
    doc="Voxel occupancy of a frame at one stride: the targets of occupancy classification and of "
        "dispersion-controlled supervision.",
    split_field="stride_name",
    fields=(
        Field("id", pa.string(), "Stable hash of the frame id and stride."),
        Field("frame_id", pa.string(), "The `frames` row."),
        Field("stride", pa.int32(), "1, 2, 4 or 8 (x and y; z strides as the backbone's layer at that stride)."),
        Field("stride_name", pa.string(), "s1, s2, s4, s8."),
        Field("spatial_shape", INT3, "Grid (z, y, x) at this stride."),
        Field("coords", COORDS, "Occupied cells (z, y, x), sorted."),
    ),
)

TABLES = (FRAMES, VOXELS, FEATURES, OCCUPANCY)
