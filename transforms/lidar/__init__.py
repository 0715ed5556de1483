"""LiDAR: readers, simulator, voxelization, the frozen VoxelBackBone8x and occupancy targets."""
