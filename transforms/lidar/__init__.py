"""LiDAR: readers, the simulator (sensor.py, scene.py, simulate.py), voxelization, the frozen
VoxelBackBone8x and occupancy targets."""
