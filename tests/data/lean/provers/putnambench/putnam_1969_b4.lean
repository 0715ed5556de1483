import Mathlib

open scoped Real EuclideanGeometry

/--
$Γ$ is a plane curve of length 1. Show that we can find a closed rectangle of area 1/4 which covers $Γ$.
-/
theorem putnam_1969_b4
    (Γ : ℝ → EuclideanSpace ℝ (Fin 2))
    --Note: the problem doesn't say what regularity conditions we should impose on `Γ` - hopefully continuity is enough.
    (Γ_cts : ContinuousOn Γ (Set.Icc 0 1))
    (hΓ : eVariationOn Γ (Set.Icc 0 1) = 1) :
    letI : Module.Oriented ℝ (EuclideanSpace ℝ (Fin 2)) (Fin 2) := ⟨Module.Basis.orientation <| PiLp.basisFun 2 ℝ (Fin 2)⟩
    letI : Fact (Module.finrank ℝ (EuclideanSpace ℝ (Fin 2)) = 2) := ⟨finrank_euclideanSpace_fin⟩
    ∃ (a b c d : EuclideanSpace ℝ (Fin 2)), Γ '' (Set.Icc 0 1) ⊆
      convexHull ℝ {a, b, c, d} ∧ dist a b * dist b c = 1/4 ∧
      --`abcd` is a rectangle
      letI π_div_2 := Real.Angle.coe <| π / 2
      (∡ a b c = π_div_2 ∧ ∡ b c d = π_div_2 ∧ ∡ c d a = π_div_2 ∧ ∡ d a b = π_div_2) :=
  sorry
