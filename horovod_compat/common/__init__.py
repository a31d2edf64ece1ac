"""Framework-independent pieces shared by every frontend (basics, process sets, utilities)."""
